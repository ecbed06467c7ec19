import { SERVERS } from '../support/servers';
import { eventually, metricValue } from '../support/sequence-test-app';
import { inboxHandler } from '../outbox/outbox-test-app';
import {
  copiesById,
  createPostgresOutboxApp,
  eachTimes,
  FAST_RELAY,
  messageIds,
} from './support/outbox-app';
import {
  OutboxRelayProcess,
  type OutboxRelaySettings,
} from '../support/processes/outbox-relay-process';
import { useRelayProcesses } from './support/relay-processes';
import { describeOnOutboxServers } from './support/outbox-servers';
import { AMQP_URL } from '../support/rabbitmq.fixture';
import { QueueCollector } from './support/resequencer-output';

jest.setTimeout(60_000);

const EVENTS = 5;

/**
 * Guarantees table, row "relay crash", for the Outbox on PostgreSQL and RabbitMQ. A relay
 * process claims committed records (a row lock in a transaction that lasts as long as the
 * publishing) and is killed with SIGKILL, either before its publishes reach the broker or after
 * the broker confirmed them but before the claim could mark them: either way the claim's
 * transaction dies with its connection, the records are PENDING again, and a restarted relay
 * publishes them. Nothing is lost; in the second case each goes out twice, and the receiving
 * inbox absorbs the duplicate.
 */
describeOnOutboxServers('faults: an outbox relay process killed in the middle of a claim', () => {
  const { servers, processes, apps, dir } = useRelayProcesses('nseq-fault-outbox-crash-');

  /**
   * The relay that will be killed, committing EVENTS events once it runs, and the one that will
   * replace it, started together: the replacement loads its code and waits for `go()`.
   */
  async function startRelays(
    channels: readonly string[],
    relay: OutboxRelaySettings['relay'],
  ): Promise<{ first: OutboxRelayProcess; restarted: OutboxRelayProcess }> {
    const settings: OutboxRelaySettings = {
      databaseUrl: SERVERS.postgres.url,
      amqpUrl: AMQP_URL,
      tablePrefix: servers.tablePrefix,
      dir: dir(),
      channels,
    };
    const starting = [
      OutboxRelayProcess.start({ ...settings, relay, commit: EVENTS, idPrefix: 'order' }),
      OutboxRelayProcess.standby(settings),
    ];
    const started = await Promise.allSettled(starting);
    for (const result of started) if (result.status === 'fulfilled') processes.push(result.value);
    const [first, restarted] = await Promise.all(starting);
    return { first, restarted };
  }

  const outboxRows = () => servers.postgres.rows(servers.tablePrefix);

  it('killed after the commit and before publishing: nothing is on the queue, the records are PENDING, and a restarted relay publishes each once', async () => {
    const channel = servers.admin.newChannel();
    const { first, restarted } = await startRelays([channel], 'block-before-publish');
    const ids = await first.committed();
    // Its relay claimed them all (one transaction, one batch) and holds them before the broker.
    await first.reported('blocked', ids, channel);

    await first.kill();
    expect(await new QueueCollector(servers.admin, channel).collect()).toEqual([]);
    expect(await outboxRows()).toEqual(
      ids.map((id) => ({ id, status: 'PENDING', attempts: 0, lastError: null })),
    );

    await restarted.go();
    const queue = new QueueCollector(servers.admin, channel);
    await queue.atLeast(EVENTS, 'every committed event published after the restart');
    await eventually(
      async () => (await outboxRows()).every((row) => row.status === 'COMPLETED'),
      'every record marked completed',
    );
    await queue.collect();
    expect(copiesById(messageIds(queue.messages))).toEqual(eachTimes(ids, 1));
    expect((await outboxRows()).map((row) => row.attempts)).toEqual(ids.map(() => 1));
  });

  it('killed after publishing and before marking: the restarted relay publishes again, and the inbox runs the handler once per id', async () => {
    const consumed = servers.admin.newChannel();
    const audit = servers.admin.newChannel(); // a second route: every copy stays here for counting
    const consumerPrefix = servers.postgres.newTablePrefix();
    const handled = `${consumerPrefix}handled`;
    await servers.postgres.query(
      `CREATE TABLE ${handled} (call BIGSERIAL PRIMARY KEY, message_id TEXT NOT NULL)`,
    );
    const OrderPlacedHandler = inboxHandler({
      event: 'OrderPlaced',
      channel: consumed,
      processInTransaction: true,
    });
    const consumer = await createPostgresOutboxApp({
      tablePrefix: consumerPrefix,
      outbox: { inboxEvents: FAST_RELAY, outboxEvents: { enabled: false } },
      providers: [OrderPlacedHandler],
    });
    apps.push(consumer);
    const handler = consumer.handler(OrderPlacedHandler);
    handler.onCall = async (message, { transaction }) => {
      await transaction!.query(`INSERT INTO ${handled} (message_id) VALUES ($1)`, [message.id]);
    };
    const { first, restarted } = await startRelays([consumed, audit], 'hang-after-publish');

    const ids = await first.committed();
    // The broker confirmed every copy (both routes); the claim that would mark them never ends.
    await first.reported('published', ids, audit);
    await first.kill();
    expect(await outboxRows()).toEqual(
      ids.map((id) => ({ id, status: 'PENDING', attempts: 0, lastError: null })),
    );

    await restarted.go();
    const copies = new QueueCollector(servers.admin, audit);
    await copies.atLeast(2 * EVENTS, 'two copies of each event');
    const duplicates = () =>
      metricValue(consumer.metrics.registry, 'nest_sequence_inbox_received_total', {
        box: 'inbox_events',
        outcome: 'duplicate',
      });
    await eventually(
      async () => (await duplicates()) === EVENTS,
      'the consumer receiving each second copy',
    );
    await eventually(
      async () => (await outboxRows()).every((row) => row.status === 'COMPLETED'),
      'every outbox record marked completed',
    );
    await consumer.runtime.idle();

    await copies.collect();
    expect(copiesById(messageIds(copies.messages))).toEqual(eachTimes(ids, 2));
    expect(copiesById(handler.calls.map((call) => call.id))).toEqual(eachTimes(ids, 1));
    const calls = await servers.postgres.query<{ message_id: string }>(
      `SELECT message_id FROM ${handled}`,
    );
    expect(copiesById(calls.map((row) => row.message_id))).toEqual(eachTimes(ids, 1));
    const inbox = await servers.postgres.rows(consumerPrefix, 'inbox_events');
    expect([...inbox].sort((a, b) => a.id.localeCompare(b.id))).toEqual(
      [...ids].sort().map((id) => ({ id, status: 'COMPLETED', attempts: 1, lastError: null })),
    );
    expect(await servers.admin.readyCount(consumed)).toBe(0);
    expect(await servers.admin.readyCount(`${consumed}.dlq`)).toBe(0);
  });
});
