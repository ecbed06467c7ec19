import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import type { Database } from 'better-sqlite3';
import type { PoolClient } from 'pg';
import {
  OutboxTransactionFinishedError,
  type OutboxStore,
  type OutboxTransaction,
} from 'nest-sequence';
import { NestedTransactionOpenError } from '../../src/core/errors/nested-transaction-open.error';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { SqliteOutboxStore } from 'nest-sequence/sqlite';
import { describeWithServer, SERVERS } from '../support/servers';
import { createOutboxTestApp, type OutboxTestApp } from './outbox-test-app';

/** A promise to wait for, and what resolves it. */
function gate(): { opened: Promise<void>; open: () => void } {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { opened, open };
}

const placed = (id: string) => ({
  type: 'OrderPlaced',
  aggregateType: 'Order',
  aggregateId: id,
  payload: { id },
});

interface Setup {
  readonly store: () => Promise<OutboxStore>;
  /** `INSERT INTO <table> (id) VALUES (<placeholder>)`. */
  readonly insert: (table: string) => string;
  /** The same insert sent through the driver's own handle (`tx.client`). */
  readonly insertThroughClient: (client: unknown, sql: string, id: string) => Promise<unknown>;
}

/**
 * Work left running by a transaction that ended (committed, or rolled back with
 * NestedTransactionOpenError), or by a nested one that ended before its enclosing one: every
 * statement, driver call and message it makes later is refused, and nothing of it lands anywhere.
 */
function endedTransactionCases(setup: Setup, table: () => string): void {
  let t: OutboxTestApp;

  beforeEach(async () => {
    t = await createOutboxTestApp({ store: await setup.store() });
    await t.outbox.transaction((tx) =>
      tx.query(`CREATE TABLE IF NOT EXISTS ${table()} (id TEXT PRIMARY KEY)`),
    );
  });

  afterEach(async () => {
    await t?.close();
  });

  const rows = () =>
    t.outbox.transaction(async (tx) =>
      (await tx.query<{ id: string }>(`SELECT id FROM ${table()} ORDER BY id`)).rows.map(
        (r) => r.id,
      ),
    );

  /** Each late step's outcome: 'refused' (OutboxTransactionFinishedError), or what happened. */
  async function lateSteps(tx: OutboxTransaction, tag: string): Promise<Record<string, string>> {
    const outcome = async (step: () => unknown): Promise<string> => {
      try {
        await step();
        return 'ran';
      } catch (error) {
        return error instanceof OutboxTransactionFinishedError ? 'refused' : String(error);
      }
    };
    const steps = {
      query: await outcome(() => tx.query(setup.insert(table()), [`${tag}-query`])),
      client: await outcome(() =>
        setup.insertThroughClient(tx.client, setup.insert(table()), `${tag}-client`),
      ),
      publishEvent: await outcome(() => tx.publishEvent(placed(`${tag}-event`))),
    };
    lateOf = steps;
    return steps;
  }
  let lateOf: Record<string, string> | undefined;

  const refusedAll = { query: 'refused', client: 'refused', publishEvent: 'refused' };

  it('refuses what a nested transaction left running does after the outer one rolled back', async () => {
    const wrote = gate();
    const go = gate();
    let late: Promise<Record<string, string>> | undefined;
    let nested: Promise<unknown> | undefined;
    await expect(
      t.outbox.transaction(async () => {
        nested = t.outbox.transaction(async (inner) => {
          await inner.query(setup.insert(table()), ['nested']);
          wrote.open();
          await go.opened;
          late = lateSteps(inner, 'late');
          await late;
        });
        nested.catch(() => undefined);
        await wrote.opened;
      }),
    ).rejects.toThrow(NestedTransactionOpenError);
    go.open();
    await expect(nested).rejects.toThrow();
    expect({ late: await late, landed: await rows() }).toEqual({ late: refusedAll, landed: [] });
  });

  it('refuses what an innermost transaction left running does once its nested one rolled back; the outer commits without it', async () => {
    const wrote = gate();
    const go = gate();
    let innermost: Promise<Record<string, string>> | undefined;
    await t.outbox.transaction(async (outer) => {
      await outer.query(setup.insert(table()), ['outer']);
      await expect(
        t.outbox.transaction(async () => {
          innermost = t.outbox.transaction(async (inner) => {
            wrote.open();
            await go.opened;
            return lateSteps(inner, 'late');
          });
          innermost.catch(() => undefined);
          await wrote.opened;
        }),
      ).rejects.toThrow(NestedTransactionOpenError);
      go.open();
      // It rejects at its end (its savepoint is gone); what it did meanwhile is what matters.
      await innermost!.catch(() => undefined);
    });
    const late = await new Promise((resolve) => setImmediate(resolve)).then(() => lateOf);
    expect({ late, landed: await rows() }).toEqual({ late: refusedAll, landed: ['outer'] });
  });

  it('refuses what a nested transaction that returned does later, while the outer one goes on', async () => {
    let inner: OutboxTransaction | undefined;
    let late: Record<string, string> | undefined;
    await t.outbox.transaction(async (outer) => {
      await t.outbox.transaction(async (nested) => {
        inner = nested;
      });
      late = await lateSteps(inner!, 'late');
      await outer.query(setup.insert(table()), ['outer']);
    });
    expect({ late, landed: await rows() }).toEqual({ late: refusedAll, landed: ['outer'] });
  });

  it('refuses what a transaction left running does after it committed', async () => {
    let kept: OutboxTransaction | undefined;
    await t.outbox.transaction(async (tx) => {
      kept = tx;
      await tx.query(setup.insert(table()), ['committed']);
    });
    const late = await lateSteps(kept!, 'late');
    expect({ late, landed: await rows() }).toEqual({ late: refusedAll, landed: ['committed'] });
  });
}

describeWithServer(
  'postgres',
  'Outbox: work left running by an ended transaction (PostgreSQL)',
  () => {
    let prefix: string;
    beforeEach(() => {
      prefix = `txh${randomUUID().replace(/-/g, '').slice(0, 10)}_`;
    });
    afterEach(async () => {
      const store = PostgresOutboxStore.connect(SERVERS.postgres.url, { tablePrefix: prefix });
      try {
        await store.transaction(async (tx) => {
          for (const name of [
            'outbox_events',
            'outbox_commands',
            'inbox_events',
            'inbox_commands',
          ]) {
            await tx.query(`DROP TABLE IF EXISTS ${prefix}${name}`);
          }
          await tx.query(`DROP TABLE IF EXISTS ${prefix}outbox_migrations`);
          await tx.query(`DROP TABLE IF EXISTS ${prefix}orders`);
        });
      } finally {
        await store.close();
      }
    });

    endedTransactionCases(
      {
        store: async () =>
          PostgresOutboxStore.connect(SERVERS.postgres.url, { tablePrefix: prefix }),
        insert: (name) => `INSERT INTO ${name} (id) VALUES ($1)`,
        insertThroughClient: (client, sql, id) => (client as PoolClient).query(sql, [id]),
      },
      () => `${prefix}orders`,
    );
  },
);

describe('Outbox: work left running by an ended transaction (SQLite file)', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'nseq-ended-tx-'));
  });
  afterEach(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  endedTransactionCases(
    {
      store: () => SqliteOutboxStore.open({ filename: join(dir, 'outbox.db') }),
      insert: (name) => `INSERT INTO ${name} (id) VALUES (?)`,
      insertThroughClient: async (client, sql, id) => (client as Database).prepare(sql).run(id),
    },
    () => 'orders',
  );
});
