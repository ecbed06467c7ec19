import { eventually } from '../support/sequence-test-app';
import {
  copiesById,
  createPostgresOutboxApp,
  eachTimes,
  messageIds,
  orderPlaced,
  type PostgresOutboxApp,
} from './support/outbox-app';
import { refuseEveryPublish } from './support/broker-policy';
import { describeOnOutboxServers, useOutboxServers } from './support/outbox-servers';
import { QueueCollector } from './support/resequencer-output';

jest.setTimeout(30_000);

const MAX_ATTEMPTS = 3;
/** Slow enough retries that the other events go out while the poison one is still retried. */
const RETRY_MS = 1_000;

/**
 * Guarantees table, row "poison message", for the Outbox on PostgreSQL and RabbitMQ: the broker
 * refuses every publish of one event (a negative confirm from a queue that takes nothing). The
 * relay retries it with backoff and marks it FAILED with the broker's refusal after
 * `maxAttempts`, while the events behind it go out at once: a poison record holds nothing back.
 */
describeOnOutboxServers('faults: an event the broker refuses every time', () => {
  const apps: PostgresOutboxApp[] = [];
  const policies: Array<() => Promise<void>> = [];
  const servers = useOutboxServers({
    beforeCleanup: async () => {
      for (const app of apps.splice(0)) await app.close();
      for (const clear of policies.splice(0)) await clear();
    },
  });

  it('is FAILED after maxAttempts with the broker refusal as its error, while the other events keep flowing', async () => {
    const refused = servers.admin.newChannel();
    const channel = servers.admin.newChannel();
    const settingUp = [
      refuseEveryPublish(refused).then((clear) => policies.push(clear)),
      createPostgresOutboxApp({
        tablePrefix: servers.tablePrefix,
        outbox: {
          routes: { event: (event) => (event.type === 'Poison' ? refused : channel) },
          outboxEvents: {
            pollIntervalMs: 100,
            retry: {
              attempts: MAX_ATTEMPTS,
              baseDelayMs: RETRY_MS,
              maxDelayMs: RETRY_MS,
            },
          },
        },
      }).then((app) => apps.push(app)),
    ];
    await Promise.allSettled(settingUp);
    await Promise.all(settingUp);
    const [t] = apps;

    const poison = await t.outbox.transaction(async (tx) =>
      tx.publishEvent({
        id: 'poison',
        type: 'Poison',
        aggregateType: 'Order',
        aggregateId: 'poison',
        payload: {},
      }),
    );
    const ids: string[] = [];
    for (let i = 0; i < 10; i++) {
      ids.push(
        await t.outbox.transaction(async (tx) => tx.publishEvent(orderPlaced(`order-${i}`))),
      );
    }

    const queue = new QueueCollector(servers.admin, channel);
    await queue.atLeast(ids.length, 'the other events published');
    // They did not wait for it: it is still being retried.
    const meanwhile = await t.outbox.record('outbox_events', poison);
    expect(meanwhile).toMatchObject({ status: 'PENDING', lastError: expect.any(String) });
    expect(meanwhile!.attempts).toBeGreaterThanOrEqual(1);
    expect(meanwhile!.attempts).toBeLessThan(MAX_ATTEMPTS);

    await eventually(
      async () => (await t.outbox.record('outbox_events', poison))?.status === 'FAILED',
      'the poison event FAILED',
      10_000,
    );
    const failed = await t.outbox.failed('outbox_events');
    expect(failed.map((record) => [record.id, record.attempts])).toEqual([[poison, MAX_ATTEMPTS]]);
    expect(failed[0].lastError).toBe(
      `PublishRejectedError: the broker refused a message to ${refused} (negative confirm); ` +
        "check the queue's length limits and the broker's logs, then publish again",
    );
    expect(await servers.admin.readyCount(refused)).toBe(0);

    await queue.collect();
    expect(copiesById(messageIds(queue.messages))).toEqual(eachTimes(ids, 1));
    const others = (await servers.postgres.rows(servers.tablePrefix)).filter(
      (r) => r.id !== poison,
    );
    expect(others.filter((row) => row.status !== 'COMPLETED' || row.attempts !== 1)).toEqual([]);
    expect(await t.outbox.stats('outbox_events')).toMatchObject({ pending: 0, failed: 1 });
  });
});
