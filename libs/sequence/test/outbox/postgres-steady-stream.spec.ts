/**
 * A relay under a steady stream of commits, on PostgreSQL: a commit while a claim publishes
 * starts no claim beside it; the next claim takes everything committed meanwhile, in one batch.
 */
import type { OutboxStore } from 'nest-sequence/ports';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { describeWithServer, SERVERS } from '../support/servers';
import { usePostgres } from '../support/postgres.fixture';
import { overrideMethods } from '../support/override-methods';
import { eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, FAST_BOX, type OutboxTestApp } from './outbox-test-app';

describeWithServer('postgres', 'Outbox relay on PostgreSQL: commits during a claim', () => {
  const apps: OutboxTestApp[] = [];
  const stores: PostgresOutboxStore[] = [];
  const pg = usePostgres({
    beforeCleanup: async () => {
      for (const app of apps.splice(0)) await app.close();
      for (const store of stores.splice(0)) await store.close().catch(() => undefined);
    },
  });

  it('go out together in the claim after the one publishing, not in claims beside it', async () => {
    const store = PostgresOutboxStore.connect(SERVERS.postgres.url, {
      tablePrefix: pg.tablePrefix,
    });
    stores.push(store);
    /** The size of each `outbox_events` batch the relay locked, in order. */
    const batches: number[] = [];
    const counted = overrideMethods<OutboxStore>(store, {
      claim: (box, options, handle) =>
        store.claim(box, options, (batch) => {
          if (box === 'outbox_events') batches.push(batch.records.length);
          return handle(batch);
        }),
    });
    const t = await createOutboxTestApp({
      store: counted,
      outboxEvents: {
        ...FAST_BOX,
        // No poll during the test: only commits and the relay's own claims start claims.
        pollIntervalMs: 600_000,
        batchSize: 100,
        concurrency: 3,
      },
    });
    apps.push(t);
    let release: () => void = () => undefined;
    const slowBroker = new Promise<void>((resolve) => (release = resolve));
    t.transport.beforePublish = () => (t.transport.attempts.length === 1 ? slowBroker : undefined);
    const commit = (n: number) =>
      t.outbox.transaction(async (tx) =>
        tx.publishEvent({
          type: 'Step',
          aggregateType: 'Agg',
          aggregateId: `a${n}`,
          payload: { n },
        }),
      );

    await commit(0);
    await eventually(() => t.transport.attempts.length === 1, 'the first publish started');
    for (let n = 1; n <= 4; n++) await commit(n); // each wakes the relay
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect({ batches, publishes: t.transport.attempts.length }).toEqual({
      batches: [1],
      publishes: 1,
    });

    release();
    await eventually(
      async () => (await t.outbox.stats('outbox_events')).pending === 0,
      'no record left PENDING',
    );
    await t.runtime.idle();
    expect(batches).toEqual([1, 4]);
    const published = t.broker
      .peek('events.Step')
      .map(
        (message) => (JSON.parse(message.body.toString()) as { payload: { n: number } }).payload.n,
      );
    expect(published.sort()).toEqual([0, 1, 2, 3, 4]);
  });
});
