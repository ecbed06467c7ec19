import { SERVERS } from '../support/servers';
import { eventually } from '../support/sequence-test-app';
import {
  copiesById,
  createPostgresOutboxApp,
  eachTimes,
  messageIds,
  orderPlaced,
} from './support/outbox-app';
import { OutboxRelayProcess } from '../support/processes/outbox-relay-process';
import { useRelayProcesses } from './support/relay-processes';
import { describeOnOutboxServers } from './support/outbox-servers';
import { AMQP_URL } from '../support/rabbitmq.fixture';
import { QueueCollector } from './support/resequencer-output';

jest.setTimeout(90_000);

const RELAYS = 3;
const TRANSACTIONS = 40;
const EVENTS_PER_TRANSACTION = 10;

/**
 * Guarantees table, row "several relays", for the Outbox on PostgreSQL and RabbitMQ: three relay
 * processes, each with its own pool, share one outbox table while an application commits events
 * into it. Every commit wakes all three (NOTIFY), and their claims (`FOR UPDATE SKIP LOCKED`, a
 * small batch each) split the records between them: each record is published, and, with no
 * fault, exactly once.
 */
describeOnOutboxServers('faults: three relay processes on one outbox table', () => {
  const { servers, processes, apps, dir } = useRelayProcesses('nseq-fault-outbox-relays-');

  it('publishes every committed event exactly once, the three relays sharing the work', async () => {
    const channel = servers.admin.newChannel();
    const starting = Array.from({ length: RELAYS }, () =>
      OutboxRelayProcess.start({
        databaseUrl: SERVERS.postgres.url,
        amqpUrl: AMQP_URL,
        tablePrefix: servers.tablePrefix,
        channels: [channel],
        dir: dir(),
        batchSize: 5,
      }),
    );
    for (const result of await Promise.allSettled(starting)) {
      if (result.status === 'fulfilled') processes.push(result.value);
    }
    const relays = await Promise.all(starting);
    // The writer has no relay of its own: only the three processes publish.
    const writer = await createPostgresOutboxApp({
      tablePrefix: servers.tablePrefix,
      outbox: { outboxEvents: { enabled: false }, routes: { event: () => channel } },
    });
    apps.push(writer);

    const ids: string[] = [];
    for (let t = 0; t < TRANSACTIONS; t++) {
      ids.push(
        ...(await writer.outbox.transaction(async (tx) =>
          Array.from({ length: EVENTS_PER_TRANSACTION }, (_, i) =>
            tx.publishEvent(orderPlaced(`order-${t}-${i}`)),
          ),
        )),
      );
    }

    const queue = new QueueCollector(servers.admin, channel);
    await queue.atLeast(ids.length, 'every committed event published', 30_000);
    // Once none is PENDING, every publish was settled: a duplicate would be on the queue by now.
    await eventually(
      async () => (await writer.outbox.stats('outbox_events')).pending === 0,
      'no record left PENDING',
    );
    await queue.collect();
    expect(copiesById(messageIds(queue.messages))).toEqual(eachTimes(ids, 1));
    const rows = await servers.postgres.rows(servers.tablePrefix);
    expect(rows.filter((row) => row.status !== 'COMPLETED' || row.attempts !== 1)).toEqual([]);

    const publishedBy = relays.map(
      (relay) => relay.ownEvents().filter((e) => e.event === 'published').length,
    );
    expect(publishedBy.reduce((sum, n) => sum + n, 0)).toBe(ids.length);
    // Each took part: the claims really ran side by side on one table.
    expect(publishedBy.filter((n) => n > 0)).toHaveLength(RELAYS);
  });
});
