import { BrokerUnavailableError } from 'nest-sequence/rabbitmq';
import { eventually } from '../support/sequence-test-app';
import { raiseMemoryAlarm } from './support/broker-alarm';
import {
  copiesById,
  createPostgresOutboxApp,
  messageIds,
  orderPlaced,
  type PostgresOutboxApp,
} from './support/outbox-app';
import { describeOnOutboxServers, useOutboxServers } from './support/outbox-servers';
import { QueueCollector } from './support/resequencer-output';

jest.setTimeout(60_000);

const MAX_ATTEMPTS = 2;
const PUBLISH_TIMEOUT_MS = 300;

/**
 * Guarantees table, row "the broker is unreachable", for its subtle case: RabbitMQ is up and the
 * connection open, but a resource alarm (memory, here; disk alike) blocks every publish, and no
 * confirm comes. That is an outage, not a fault of the records: however long it lasts, no
 * record may be counted an attempt, let alone turn FAILED; once it clears, every record goes out.
 */
describeOnOutboxServers('faults: the broker blocks publishing (a resource alarm)', () => {
  const apps: PostgresOutboxApp[] = [];
  let clearAlarm: (() => Promise<void>) | undefined;
  const servers = useOutboxServers({
    beforeCleanup: async () => {
      try {
        await clearAlarm?.();
      } finally {
        clearAlarm = undefined;
        for (const app of apps.splice(0)) await app.close();
      }
    },
  });

  it('keeps every record PENDING with no attempt counted while it lasts, then publishes every one', async () => {
    const channel = servers.admin.newChannel();
    const t = await createPostgresOutboxApp({
      tablePrefix: servers.tablePrefix,
      outbox: {
        routes: { event: () => channel },
        outboxEvents: {
          pollIntervalMs: 100,
          retry: { attempts: MAX_ATTEMPTS, baseDelayMs: 20, maxDelayMs: 50 },
        },
      },
      module: { publish: { confirmTimeoutMs: PUBLISH_TIMEOUT_MS } },
    });
    apps.push(t);
    // One event before the alarm: the output queue is declared, the connection has published.
    const first = await t.outbox.transaction(async (tx) => tx.publishEvent(orderPlaced('first')));
    const queue = new QueueCollector(servers.admin, channel);
    await queue.atLeast(1, 'the first event published');

    clearAlarm = await raiseMemoryAlarm();
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      ids.push(
        await t.outbox.transaction(async (tx) => tx.publishEvent(orderPlaced(`order-${i}`))),
      );
    }
    // The relay's publishes wait for confirms that do not come; the broker says why.
    await eventually(
      () =>
        t.transport.ping().then(
          () => false,
          (error: Error) =>
            error instanceof BrokerUnavailableError &&
            error.reason === 'blocked' &&
            /blocked publishing on this connection: low on memory/.test(error.message),
        ),
      'the transport reports the broker blocking it',
      10_000,
    );
    // Many times what MAX_ATTEMPTS timed-out publishes and their retries take.
    await new Promise((resolve) => setTimeout(resolve, 10 * MAX_ATTEMPTS * PUBLISH_TIMEOUT_MS));
    for (const id of ids) {
      expect(await t.outbox.record('outbox_events', id)).toMatchObject({
        status: 'PENDING',
        attempts: 0,
      });
    }

    await clearAlarm();
    clearAlarm = undefined;
    await queue.atLeast(ids.length + 1, 'every event published once the alarm cleared');
    await eventually(
      async () => (await t.outbox.stats('outbox_events')).pending === 0,
      'no record pending',
    );
    await t.transport.ping();
    await queue.collect();
    // At least once: a publish that timed out was held in the blocked connection, not lost, and
    // the broker may take it as well as the relay's next attempt (the consumer's inbox dedupes).
    const copies = copiesById(messageIds(queue.messages));
    expect(Object.keys(copies).sort()).toEqual([first, ...ids].sort());
    expect(await t.outbox.stats('outbox_events')).toMatchObject({ failed: 0 });
  });
});
