import { randomBytes } from 'node:crypto';
import type { OutboxStore } from '../../ports/outbox-store.port';
import { describeAppendCases } from './outbox-store/append.cases';
import { describeArgumentCases } from './outbox-store/arguments.cases';
import { describeClaimCases } from './outbox-store/claim.cases';
import { describeConcurrencyCases } from './outbox-store/concurrency.cases';
import { describeExternalTransactionCases } from './outbox-store/external-transaction.cases';
import { describeInboxCases } from './outbox-store/inbox.cases';
import { describeMaintenanceCases } from './outbox-store/maintenance.cases';
import { describeOrderingCases } from './outbox-store/ordering.cases';
import {
  appendCommitted,
  BOX,
  claimAndComplete,
  createBusinessTable,
  record,
  type BusinessTable,
  type ExternalConnection,
  type OutboxSuiteContext,
} from './outbox-store/outbox-suite.context';
import { describeTransactionCases } from './outbox-store/transaction.cases';
import { describeWatchCases } from './outbox-store/watch.cases';

export interface OutboxStoreHarness {
  /** A fresh, migrated store over empty tables of its own (a unique tablePrefix). */
  create(): Promise<OutboxStore>;
  /**
   * A second store instance over the same tables, with its own connection(s), as another
   * process would have it (SQLite: a second connection to the same database file). Closed by
   * the suite with `close`.
   */
  peer(store: OutboxStore): Promise<OutboxStore>;
  /** Closes a store (created or peer) and drops what create() made; `store.close()` when absent. */
  close?(store: OutboxStore): Promise<void>;
  /**
   * PostgreSQL only: a connection of the caller's own, for `append(box, records, executor)`
   * inside a transaction the caller opens and commits (`BEGIN`/`COMMIT`/`ROLLBACK` through it).
   * The cases about the caller's own transaction run only when it is given.
   */
  externalConnection?(store: OutboxStore): Promise<ExternalConnection>;
}

/**
 * The {@link OutboxStore} contract (its port's doc comment), run against every adapter. Each test
 * has tables of its own and, where times matter, explicit `now` values near the real clock.
 * Cases never call the store from inside a claim's `handle` other than through
 * `batch.transaction` or `transaction()`: on an embedded store anything else may wait for the
 * claim itself.
 */
export function describeOutboxStoreConformance(name: string, harness: OutboxStoreHarness): void {
  describe(`OutboxStore conformance: ${name}`, () => {
    let opened: OutboxStore[] = [];
    let tables: string[] = [];
    const context = {} as { -readonly [K in keyof OutboxSuiteContext]: OutboxSuiteContext[K] };

    beforeEach(async () => {
      const store = await harness.create();
      opened = [store];
      tables = [];
      Object.assign(context, {
        store,
        t0: Date.now(),
        peer: async () => {
          const other = await harness.peer(store);
          opened.push(other);
          return other;
        },
        businessTable: async (): Promise<BusinessTable> => {
          const table = `conformance_business_${randomBytes(6).toString('hex')}`;
          tables.push(table);
          return createBusinessTable(store, table);
        },
        externalConnection: () => {
          if (!harness.externalConnection) throw new Error(`${name} has no external connection`);
          return harness.externalConnection(store);
        },
      } satisfies OutboxSuiteContext);
    });

    afterEach(async () => {
      const [store] = opened;
      for (const table of tables) {
        await store.transaction((tx) => tx.query(`DROP TABLE IF EXISTS ${table}`));
      }
      // Peers first: the tables they share are dropped with the store that created them.
      for (const each of [...new Set(opened)].reverse()) {
        await (harness.close ? harness.close(each) : each.close());
      }
    });

    describe('store', () => {
      it('has a dialect and a name, and answers ping', async () => {
        expect(['postgres', 'sqlite']).toContain(context.store.dialect);
        expect(typeof context.store.name).toBe('string');
        expect(context.store.name.length).toBeGreaterThan(0);
        await expect(context.store.ping()).resolves.toBeUndefined();
      });

      it('migrates again without losing records, one call after the other', async () => {
        await appendCommitted(context.store, BOX, [record('kept')]);
        await context.store.migrate();
        await context.store.migrate();
        await expect(context.store.get(BOX, 'kept')).resolves.toMatchObject({ id: 'kept' });
        await expect(claimAndComplete(context.store, BOX, { limit: 10, now: 0 })).resolves.toEqual([
          'kept',
        ]);
      });

      it('migrates from several instances at once', async () => {
        const peer = await context.peer();
        await Promise.all([
          context.store.migrate(),
          peer.migrate(),
          context.store.migrate(),
          peer.migrate(),
        ]);
        await appendCommitted(peer, BOX, [record('after-migrations')]);
        await expect(claimAndComplete(context.store, BOX, { limit: 10, now: 0 })).resolves.toEqual([
          'after-migrations',
        ]);
      });

      it('closes idempotently, and then no longer answers ping', async () => {
        const peer = await context.peer();
        await peer.close();
        await expect(peer.close()).resolves.toBeUndefined();
        // Not toThrow(): a driver's native error may come from another jest realm than Error.
        await expect(peer.ping()).rejects.toHaveProperty('message', expect.any(String));
        await expect(context.store.ping()).resolves.toBeUndefined();
      });
    });

    describeTransactionCases(context);
    if (harness.externalConnection) describeExternalTransactionCases(context);
    describeAppendCases(context);
    describeClaimCases(context);
    describeOrderingCases(context);
    describeInboxCases(context);
    describeMaintenanceCases(context);
    describeConcurrencyCases(context);
    describeWatchCases(context);
    describeArgumentCases(context);
  });
}
