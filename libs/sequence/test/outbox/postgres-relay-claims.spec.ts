/**
 * How a relay's claims run, on PostgreSQL.
 *
 * On a backlog: rows committed while no relay ran are drained by several claims at once (a claim
 * that took a full batch starts one more beside the next, up to `concurrency`), and those claims,
 * each locking its rows with `FOR UPDATE SKIP LOCKED`, still publish every event exactly once,
 * each aggregate's in commit order when the box is ordered.
 *
 * Under a steady stream: a commit while a claim publishes starts no claim beside it; the next
 * claim takes everything committed meanwhile, in one batch.
 */
import type { OutboxStore } from 'nest-sequence/ports';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { describeWithServer, SERVERS } from '../support/servers';
import { usePostgres } from '../support/postgres.fixture';
import { overrideMethods } from '../support/override-methods';
import { eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, FAST_BOX, type OutboxTestApp } from './outbox-test-app';

/**
 * More aggregates than a batch holds: an ordered claim takes the first row of every aggregate it
 * reaches, so with fewer, one claim holds them all and the others find nothing to take.
 */
const AGGREGATES = ['a0', 'a1', 'a2', 'a3', 'a4', 'a5'];
const ROUNDS = 12;
const BATCH_SIZE = 5;
const CONCURRENCY = 3;

/** One committed event, as the test knows it. */
interface Committed {
  readonly id: string;
  readonly aggregateId: string;
  readonly n: number;
}

/** Claims of one box on a store, counted: those still locking, and those holding a batch. */
interface ClaimCounts {
  /** Claims that have neither locked a batch nor ended. */
  locking: number;
  /** Claims handling a non-empty batch now, and the most there ever were at once. */
  holding: number;
  mostHolding: number;
}

describeWithServer(
  'postgres',
  'Outbox relay on PostgreSQL: its claims on a backlog and under a steady stream',
  () => {
    const apps: OutboxTestApp[] = [];
    const stores: PostgresOutboxStore[] = [];
    const pg = usePostgres({
      beforeCleanup: async () => {
        for (const app of apps.splice(0)) await app.close();
        // The app does not close a store it was given.
        for (const store of stores.splice(0)) await store.close().catch(() => undefined);
      },
    });

    function connectStore(): PostgresOutboxStore {
      const store = PostgresOutboxStore.connect(SERVERS.postgres.url, {
        tablePrefix: pg.tablePrefix,
      });
      stores.push(store);
      return store;
    }

    /**
     * Commits `ROUNDS` transactions, each appending one event to every aggregate, through an
     * application whose relay is off, then closes it: a backlog no relay has seen (and no commit
     * will wake one for). Resolves with the events in commit order.
     */
    async function commitBacklog(ordered: boolean): Promise<Committed[]> {
      const writer = await createOutboxTestApp({
        store: connectStore(),
        outboxEvents: { enabled: false, ordered },
      });
      const committed: Committed[] = [];
      for (let n = 1; n <= ROUNDS; n++) {
        const ids = await writer.outbox.transaction(async (tx) =>
          AGGREGATES.map((aggregateId) =>
            tx.publishEvent({ type: 'Step', aggregateType: 'Agg', aggregateId, payload: { n } }),
          ),
        );
        ids.forEach((id, i) => committed.push({ id, aggregateId: AGGREGATES[i], n }));
      }
      await writer.close();
      return committed;
    }

    /**
     * The store with its `outbox_events` claims counted. A claim that has locked its batch waits,
     * before handling it, until no other claim is still locking: claims started together hold
     * their rows at the same time, whichever answers first (nothing is held by a claim alone).
     */
    function countingClaims(store: OutboxStore): { store: OutboxStore; counts: ClaimCounts } {
      const counts: ClaimCounts = { locking: 0, holding: 0, mostHolding: 0 };
      const counted = overrideMethods<OutboxStore>(store, {
        claim: async (box, options, handle) => {
          if (box !== 'outbox_events') return store.claim(box, options, handle);
          counts.locking++;
          let locked = false;
          try {
            return await store.claim(box, options, async (batch) => {
              locked = true;
              counts.locking--;
              counts.holding++;
              counts.mostHolding = Math.max(counts.mostHolding, counts.holding);
              try {
                // Another claim's lock statements never wait on these rows (SKIP LOCKED).
                await eventually(() => counts.locking === 0, 'the other claims locked');
                return await handle(batch);
              } finally {
                counts.holding--;
              }
            });
          } finally {
            if (!locked) counts.locking--;
          }
        },
      });
      return { store: counted, counts };
    }

    /** Starts the relay on the backlog; resolves once every committed event was published. */
    async function relay(ordered: boolean, committed: readonly Committed[]) {
      const { store, counts } = countingClaims(connectStore());
      const t = await createOutboxTestApp({
        store,
        outboxEvents: {
          ...FAST_BOX,
          // No poll during the test: only the relay's start and its own claims start claims.
          pollIntervalMs: 600_000,
          ordered,
          batchSize: BATCH_SIZE,
          concurrency: CONCURRENCY,
        },
      });
      apps.push(t);
      await eventually(
        async () => (await t.outbox.stats('outbox_events')).pending === 0,
        'no record left PENDING',
      );
      await t.runtime.idle();
      const published = t.broker.peek('events.Step').map((message) => {
        const body = JSON.parse(message.body.toString()) as {
          id: string;
          aggregateId: string;
          payload: { n: number };
        };
        return { id: body.id, aggregateId: body.aggregateId, n: body.payload.n };
      });
      const rows = await pg.admin.rows(pg.tablePrefix);
      expect(rows).toHaveLength(committed.length);
      expect(rows.filter((row) => row.status !== 'COMPLETED' || row.attempts !== 1)).toEqual([]);
      // Exactly once each: no publish was repeated, and none was left out.
      expect(t.transport.attempts).toHaveLength(committed.length);
      expect(published.map((event) => event.id).sort()).toEqual(
        committed.map((event) => event.id).sort(),
      );
      return { published, counts };
    }

    it('ordered: publishes every event once, each aggregate in commit order, with claims holding rows at once', async () => {
      const committed = await commitBacklog(true);
      const { published, counts } = await relay(true, committed);
      for (const aggregateId of AGGREGATES) {
        const order = (events: readonly Committed[]) =>
          events.filter((event) => event.aggregateId === aggregateId).map((event) => event.id);
        expect({ aggregateId, order: order(published) }).toEqual({
          aggregateId,
          order: order(committed),
        });
      }
      // Before, one claim at a time drained a backlog: never two holding rows together.
      expect(counts.mostHolding).toBeGreaterThan(1);
      expect(counts.mostHolding).toBeLessThanOrEqual(CONCURRENCY);
    });

    it('unordered: publishes every event once, with claims holding rows at once', async () => {
      const committed = await commitBacklog(false);
      const { counts } = await relay(false, committed);
      expect(counts.mostHolding).toBeGreaterThan(1);
      expect(counts.mostHolding).toBeLessThanOrEqual(CONCURRENCY);
    });

    it('steady stream: commits during a claim go out together in the claim after it, not beside it', async () => {
      const store = connectStore();
      /** The size of each `outbox_events` batch the relay locked, in order. */
      const batches: number[] = [];
      const recording = overrideMethods<OutboxStore>(store, {
        claim: (box, options, handle) =>
          store.claim(box, options, (batch) => {
            if (box === 'outbox_events') batches.push(batch.records.length);
            return handle(batch);
          }),
      });
      const t = await createOutboxTestApp({
        store: recording,
        outboxEvents: {
          ...FAST_BOX,
          // No poll during the test: only commits and the relay's own claims start claims.
          pollIntervalMs: 600_000,
          batchSize: 100,
          concurrency: CONCURRENCY,
        },
      });
      apps.push(t);
      let release: () => void = () => undefined;
      const slowBroker = new Promise<void>((resolve) => (release = resolve));
      t.transport.beforePublish = () =>
        t.transport.attempts.length === 1 ? slowBroker : undefined;
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
          (message) =>
            (JSON.parse(message.body.toString()) as { payload: { n: number } }).payload.n,
        );
      expect(published.sort()).toEqual([0, 1, 2, 3, 4]);
    });
  },
);
