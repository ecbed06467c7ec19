import { randomBytes } from 'node:crypto';
import type { Pool, PoolClient } from 'pg';
import { record } from '../../../testing/conformance/outbox-store/outbox-suite.context';
import { adminQuery, postgresPool } from '../../../../test/support/postgres.fixture';
import { describeWithServer } from '../../../../test/support/servers';
import { BOX_NAMES, type NewBoxRecord } from '../../../ports/outbox-store.port';
import { PostgresOutboxStore } from './postgres.outbox-store';

const BOX = 'outbox_events';

/** A record PostgreSQL refuses when it writes it: the tests' box has a CHECK against its type. */
function refusedRecord(id: string): NewBoxRecord {
  return { ...record(id), type: 'refused-by-postgres' };
}

/**
 * How many times the store sends something to PostgreSQL (one `query` call of the pool's only
 * client is one round trip: a pipeline of several statements is one call), and what it sent;
 * the announcements of commits to other processes (a debounced NOTIFY) left out.
 */
describeWithServer('postgres', 'PostgresOutboxStore round trips', () => {
  let tablePrefix: string;
  let pool: Pool;
  let store: PostgresOutboxStore;
  let sent: string[];
  let counting = false;

  beforeEach(async () => {
    tablePrefix = `t${randomBytes(5).toString('hex')}_`;
    pool = postgresPool({ max: 1 });
    store = new PostgresOutboxStore(pool, { tablePrefix });
    await store.migrate();
    await pool.query(`CREATE TABLE ${tablePrefix}orders (id TEXT PRIMARY KEY)`);
    await pool.query(
      `ALTER TABLE ${tablePrefix}${BOX} ADD CONSTRAINT ${tablePrefix}refused ` +
        `CHECK (type <> 'refused-by-postgres')`,
    );
    const client: PoolClient = await pool.connect();
    const query = client.query.bind(client) as (...args: unknown[]) => unknown;
    (client as unknown as { query: unknown }).query = (...args: unknown[]) => {
      const [config] = args as [string | { text?: string }];
      const text = typeof config === 'string' ? config : (config.text ?? '');
      // The debounced announcement of an earlier commit is a statement of its own: not counted.
      if (counting && !text.includes('pg_notify($1, box)')) sent.push(text);
      return query(...args);
    };
    client.release();
    sent = [];
  });

  afterEach(async () => {
    await store.close();
    const tables = [...BOX_NAMES, 'outbox_migrations', 'orders'].map((t) => tablePrefix + t);
    await pool.query(`DROP TABLE IF EXISTS ${tables.join(', ')}`);
    await pool.end();
  });

  async function counted<T>(work: () => Promise<T>): Promise<T> {
    counting = true;
    try {
      return await work();
    } finally {
      counting = false;
    }
  }

  const orders = async (): Promise<string[]> =>
    (await adminQuery<{ id: string }>(`SELECT id FROM ${tablePrefix}orders ORDER BY id`)).map(
      (row) => row.id,
    );

  it('commits a transaction whose only writes are records appended at commit in one round trip', async () => {
    // The first use of a connection prepares each statement (one record, several): not counted.
    await store.transaction((tx) => store.appendAtCommit(BOX, [record('warm-up')], tx));
    await store.transaction((tx) =>
      store.appendAtCommit(BOX, [record('warm-1'), record('warm-2')], tx),
    );

    await counted(() =>
      store.transaction((tx) => store.appendAtCommit(BOX, [record('a'), record('b')], tx)),
    );
    await counted(() => store.transaction((tx) => store.appendAtCommit(BOX, [record('c')], tx)));

    expect(sent).toHaveLength(2);
    expect(sent[0]).toMatch(/^BEGIN;[\s\S]*unnest[\s\S]*INSERT INTO[\s\S]*;\nCOMMIT$/);
    // One record: its columns as plain parameters, no arrays.
    expect(sent[1]).toMatch(/^BEGIN;[\s\S]*INSERT INTO[\s\S]*VALUES[\s\S]*;\nCOMMIT$/);
    expect(sent[1]).not.toContain('unnest');
    for (const id of ['a', 'b', 'c']) {
      expect(await store.get(BOX, id)).toMatchObject({ status: 'PENDING' });
    }
  });

  it('sends BEGIN with the first statement, and the records with the COMMIT', async () => {
    await store.transaction((tx) => store.appendAtCommit(BOX, [record('warm-up')], tx));

    await counted(() =>
      store.transaction(async (tx) => {
        await tx.query(`INSERT INTO ${tablePrefix}orders (id) VALUES ($1)`, ['o-1']);
        await store.appendAtCommit(BOX, [record('placed')], tx);
      }),
    );

    expect(sent).toHaveLength(2);
    expect(sent[0]).toMatch(/^BEGIN;\nINSERT INTO \S+orders/);
    expect(sent[1]).toMatch(/INSERT INTO[\s\S]*;\nCOMMIT$/);
    expect(await orders()).toEqual(['o-1']);
    expect(await store.get(BOX, 'placed')).toBeDefined();
  });

  it('sends nothing for a transaction that sends nothing', async () => {
    await expect(counted(() => store.transaction(async () => 'nothing'))).resolves.toBe('nothing');
    expect(sent).toEqual([]);
  });

  it('rejects a transaction whose records PostgreSQL refuses at commit, writing nothing of it', async () => {
    const committing = store.transaction(async (tx) => {
      await tx.query(`INSERT INTO ${tablePrefix}orders (id) VALUES ($1)`, ['o-lost']);
      await store.appendAtCommit(BOX, [record('kept?'), refusedRecord('refused')], tx);
    });

    await expect(committing).rejects.toThrow(/violates check constraint/);
    expect(await orders()).toEqual([]);
    expect(await store.get(BOX, 'kept?')).toBeUndefined();
    // The connection goes on: the next transaction commits.
    await store.transaction((tx) => store.appendAtCommit(BOX, [record('after')], tx));
    expect(await store.get(BOX, 'after')).toBeDefined();
  });

  it('rejects a savepoint whose records PostgreSQL refuses with their own error; the transaction goes on', async () => {
    await store.transaction(async (tx) => {
      await tx.query(`INSERT INTO ${tablePrefix}orders (id) VALUES ($1)`, ['o-kept']);
      const inner = tx.savepoint(async () => {
        await tx.query(`INSERT INTO ${tablePrefix}orders (id) VALUES ($1)`, ['o-undone']);
        await store.appendAtCommit(BOX, [refusedRecord('refused')], tx);
      });
      await expect(inner).rejects.toThrow(/violates check constraint/);
      await store.appendAtCommit(BOX, [record('after-savepoint')], tx);
    });

    expect(await orders()).toEqual(['o-kept']);
    expect(await store.get(BOX, 'refused')).toBeUndefined();
    expect(await store.get(BOX, 'after-savepoint')).toBeDefined();
  });

  it("runs what is sent on the driver's own client inside the transaction", async () => {
    const insert = `INSERT INTO ${tablePrefix}orders (id) VALUES ($1)`;
    await expect(
      store.transaction(async (tx) => {
        await (tx.client as PoolClient).query(insert, ['o-rolled-back']);
        throw new Error('the order service refused');
      }),
    ).rejects.toThrow('the order service refused');
    expect(await orders()).toEqual([]);

    await store.transaction(async (tx) => {
      await store.appendAtCommit(BOX, [record('with-client')], tx);
      await (tx.client as PoolClient).query(insert, ['o-committed']);
    });
    expect(await orders()).toEqual(['o-committed']);
    expect(await store.get(BOX, 'with-client')).toBeDefined();
  });

  it('claims in two round trips: BEGIN with the claim, the outcomes with the COMMIT', async () => {
    await store.transaction((tx) =>
      store.appendAtCommit(BOX, [record('r1'), record('r2'), record('r3')], tx),
    );
    // Prepares the claim's statements on the connection; claims nothing more.
    await store.claim(BOX, { limit: 1, now: Date.now() }, async (batch) =>
      batch.records.map((r) => ({ id: r.id, status: 'completed' as const })),
    );

    const result = await counted(() =>
      store.claim(BOX, { limit: 10, now: Date.now() }, async (batch) =>
        batch.records.map((r) => ({ id: r.id, status: 'completed' as const })),
      ),
    );

    expect(result).toMatchObject({ claimed: 2, completed: 2 });
    expect(sent).toHaveLength(2);
    expect(sent[0]).toMatch(/^BEGIN;\nSET LOCAL idle_in_transaction_session_timeout TO 0;\nSELECT/);
    expect(sent[1]).toMatch(/^UPDATE[\s\S]*;\nCOMMIT$/);
    for (const id of ['r1', 'r2', 'r3']) {
      expect(await store.get(BOX, id)).toMatchObject({ status: 'COMPLETED' });
    }
  });

  it('settles a claim that need not be durable with the COMMIT, asking for no disk flush', async () => {
    await store.transaction((tx) => store.appendAtCommit(BOX, [record('r1'), record('r2')], tx));
    const completeAll = async (batch: { records: readonly { id: string }[] }) =>
      batch.records.map((r) => ({ id: r.id, status: 'completed' as const }));
    // Prepares the claim's statements on the connection.
    await store.claim(BOX, { limit: 1, now: Date.now(), durable: false }, completeAll);

    const result = await counted(() =>
      store.claim(BOX, { limit: 10, now: Date.now(), durable: false }, completeAll),
    );

    expect(result).toMatchObject({ claimed: 1, completed: 1 });
    expect(sent).toHaveLength(2);
    expect(sent[1]).toMatch(/^SET LOCAL synchronous_commit TO off;\nUPDATE[\s\S]*;\nCOMMIT$/);
    for (const id of ['r1', 'r2']) {
      expect(await store.get(BOX, id)).toMatchObject({ status: 'COMPLETED' });
    }
  });
});
