import type { PoolClient } from 'pg';
import { randomBytes } from 'node:crypto';
import type { Socket } from 'node:net';
import { Pool, type Notification } from 'pg';
import { describeOutboxStoreConformance } from '../../../testing/conformance/outbox-store.conformance';
import { record } from '../../../testing/conformance/outbox-store/outbox-suite.context';
import {
  adminQuery,
  postgresClient,
  postgresPool,
} from '../../../../test/support/postgres.fixture';
import { FreezingProxy } from '../../../../test/support/freezing-proxy';
import { eventually } from '../../../../test/support/sequence-test-app';
import { SERVERS, describeWithServer } from '../../../../test/support/servers';
import { OutboxForeignTransactionError } from '../../../core/errors/outbox-foreign-transaction.error';
import { OutboxStoreClosedError } from '../../../core/errors/outbox-store-closed.error';
import { PostgresOutboxError } from './postgres-outbox.error';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import {
  BOX_NAMES,
  type ClaimedBatch,
  type OutboxStore,
  type RecordOutcome,
  type StoreTransaction,
} from '../../../ports/outbox-store.port';
import { PostgresOutboxStore } from './postgres.outbox-store';

const URL = SERVERS.postgres.url;
const BOX = 'outbox_events';

function uniquePrefix(): string {
  return `t${randomBytes(5).toString('hex')}_`;
}

/**
 * Drops the tables under every prefix, a few prefixes to a statement on one connection. The
 * prefixes are unique, so the tables can wait for the end of the file: dropping them after
 * each test (a connection and a commit of its own) cost as much as the tests themselves.
 */
async function dropTables(tablePrefixes: Iterable<string>): Promise<void> {
  const tables = [...tablePrefixes].flatMap((tablePrefix) =>
    [...BOX_NAMES, 'outbox_migrations'].map((name) => `${tablePrefix}${name}`),
  );
  if (tables.length === 0) return;
  const client = postgresClient();
  await client.connect();
  try {
    for (let start = 0; start < tables.length; start += 50) {
      await client.query(`DROP TABLE IF EXISTS ${tables.slice(start, start + 50).join(', ')}`);
    }
  } finally {
    await client.end();
  }
}

describeWithServer('postgres', 'PostgresOutboxStore', () => {
  const owners = new Set<OutboxStore>();
  /** Prefixes whose tables are dropped once the file's tests are done. */
  const created = new Set<string>();

  afterAll(async () => {
    await dropTables(created);
  });

  describeOutboxStoreConformance('postgres', {
    async create() {
      const store = PostgresOutboxStore.connect(URL, { tablePrefix: uniquePrefix() });
      await store.migrate();
      owners.add(store);
      return store;
    },
    async peer(store) {
      return PostgresOutboxStore.connect(URL, {
        tablePrefix: (store as PostgresOutboxStore).tablePrefix,
      });
    },
    async close(store) {
      await store.close();
      if (owners.delete(store)) created.add((store as PostgresOutboxStore).tablePrefix);
    },
    async externalConnection() {
      const client = postgresClient();
      await client.connect();
      return { executor: client, release: () => client.end() };
    },
  });

  describe('adapter', () => {
    let tablePrefix: string;
    let store: PostgresOutboxStore;

    beforeEach(async () => {
      tablePrefix = uniquePrefix();
      store = PostgresOutboxStore.connect(URL, { tablePrefix, pool: { max: 3 } });
      await store.migrate();
    });

    afterEach(async () => {
      await store.close();
      created.add(tablePrefix);
    });

    /**
     * A transaction of `on` whose statement `sql` has been sent (`running` resolves to
     * 'committed').
     */
    async function transactionRunning(
      on: PostgresOutboxStore,
      sql: string,
    ): Promise<{ running: Promise<string> }> {
      let statementSent!: () => void;
      const sent = new Promise<void>((resolve) => (statementSent = resolve));
      const running = on.transaction(async (tx) => {
        const statement = tx.query(sql);
        statementSent();
        await statement;
        return 'committed';
      });
      await sent;
      return { running };
    }

    async function appendCommitted(ids: string[]): Promise<void> {
      await store.transaction((tx) =>
        store.append(
          BOX,
          ids.map((id) => record(id)),
          tx,
        ),
      );
    }

    it('refuses a table prefix that is not a plain identifier, saying what it must be', () => {
      expect(() => PostgresOutboxStore.connect(URL, { tablePrefix: 'bad-prefix; DROP' })).toThrow(
        SequenceOptionsError,
      );
      expect(() => PostgresOutboxStore.connect(URL, { tablePrefix: 'x'.repeat(42) })).toThrow(
        /tablePrefix/,
      );
    });

    it('takes a prefix in capitals as PostgreSQL does, in lower case: one set of tables, locks and wake-ups', async () => {
      const upper = PostgresOutboxStore.connect(URL, {
        tablePrefix: tablePrefix.toUpperCase(),
        pool: { max: 2 },
      });
      try {
        expect(upper.tablePrefix).toBe(tablePrefix);
        expect(upper.notifyChannel).toBe(store.notifyChannel);
        await expect(Promise.all([upper.migrate(), store.migrate()])).resolves.toBeDefined();
        await appendCommitted(['written-by-lower']);
        await expect(
          upper.claim(BOX, { limit: 10, now: Date.now() }, async (batch) =>
            batch.records.map((each) => ({ id: each.id, status: 'completed' as const })),
          ),
        ).resolves.toMatchObject({ claimed: 1, completed: 1 });
      } finally {
        await upper.close();
      }
    });

    it('bounds every statement of a pool it creates and keeps its connections alive; settings given win', async () => {
      const options = (created: PostgresOutboxStore) =>
        (created as unknown as { pool: Pool & { options: Record<string, unknown> } }).pool.options;
      // A claim on a connection that stops answering fails after query_timeout (the test over
      // a pool of the caller shows it), instead of stalling the relay for the socket's lifetime.
      expect(options(store)).toMatchObject({ max: 3, query_timeout: 60_000, keepAlive: true });
      const tuned = PostgresOutboxStore.connect(URL, {
        tablePrefix,
        pool: { query_timeout: 5_000, keepAlive: false },
      });
      try {
        expect(options(tuned)).toMatchObject({ max: 10, query_timeout: 5_000, keepAlive: false });
      } finally {
        await tuned.close();
      }
    });

    it('drops the connections of a pool it created when the server stops answering as it closes', async () => {
      const { proxy, url } = await FreezingProxy.toUrl(URL, 5432);
      const own = PostgresOutboxStore.connect(url, { tablePrefix, pool: { query_timeout: 1_000 } });
      const sockets: Socket[] = [];
      (own as unknown as { pool: Pool }).pool.on('connect', (client) => {
        sockets.push(client.connection.stream as Socket);
      });
      try {
        // One connection idle in the pool, one held by a transaction whose statement is running:
        // handed back once the statement outran query_timeout.
        await Promise.all([own.ping(), own.ping()]);
        const { running: held } = await transactionRunning(own, 'SELECT pg_sleep(30)');
        held.catch(() => undefined);
        await eventually(() => proxy.clientsConnected === 2, 'both connections through the proxy');
        proxy.freeze();
        const startedAt = Date.now();

        await own.close();

        expect(Date.now() - startedAt).toBeLessThan(10_000);
        await expect(held).rejects.toThrow();
        // Not half-closed and waiting for the server's end: nothing keeps the process alive.
        expect(sockets).toHaveLength(2);
        await eventually(() => sockets.every((socket) => socket.destroyed), 'the sockets closed');
      } finally {
        await own.close();
        await proxy.close();
      }
    });

    it('lets a transaction in use end before it ends its pool, however long past 2 s it runs', async () => {
      const own = PostgresOutboxStore.connect(URL, { tablePrefix });
      const { running } = await transactionRunning(own, 'SELECT pg_sleep(2.5)');

      await own.close();

      await expect(running).resolves.toBe('committed');
    });

    it('names its tables and channel after the prefix', async () => {
      expect(store.notifyChannel).toBe(`${tablePrefix}nest_sequence_outbox`);
      const tables = await adminQuery<{ tablename: string }>(
        `SELECT tablename FROM pg_tables WHERE tablename LIKE $1 ORDER BY tablename`,
        [`${tablePrefix}%`],
      );
      expect(tables.map((row) => row.tablename)).toEqual(
        [...BOX_NAMES, 'outbox_migrations'].map((name) => `${tablePrefix}${name}`).sort(),
      );
    });

    it('hands out no follower past a row of its partition that someone else holds', async () => {
      await store.transaction((tx) =>
        store.append(
          BOX,
          ['A1', 'A2', 'A3'].map((id) => record(id, { partitionKey: 'A' })),
          tx,
        ),
      );
      // An operator's transaction locks A2 (PENDING): the claim skips it, and must then not
      // hand out A3 ahead of it.
      const holder = postgresClient();
      await holder.connect();
      try {
        await holder.query('BEGIN');
        await holder.query(`SELECT 1 FROM ${tablePrefix}${BOX} WHERE id = 'A2' FOR UPDATE`);
        const handed: string[] = [];
        await store.claim(BOX, { limit: 10, now: Date.now(), ordered: true }, async (batch) => {
          handed.push(...batch.records.map((each) => each.id));
          return [];
        });
        expect(handed).toEqual(['A1']);
      } finally {
        await holder.query('ROLLBACK');
        await holder.end();
      }
    });

    it('commits the receives of one partition in seq order: an ordered claim never hands out a later one ahead of a receive still committing', async () => {
      const INBOX = 'inbox_events';
      const table = `${tablePrefix}${INBOX}`;
      const waitingOnLocks = async () =>
        (
          await adminQuery<{ waiting: number }>(
            `SELECT count(*)::int AS waiting FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE $1`,
            [`%${table}%`],
          )
        )[0].waiting;
      // Another consumer records a copy of A and has not committed: A's receive takes its seq,
      // then waits for that transaction (a receive slow to commit).
      const holder = postgresClient();
      await holder.connect();
      const handed: string[][] = [];
      let open!: () => void;
      const gate = new Promise<void>((resolve) => (open = resolve));
      let first: Promise<unknown> | undefined;
      try {
        await holder.query('BEGIN');
        await store.append(INBOX, [record('A', { partitionKey: 'order:1' })], holder);
        const receivedA = store.receive(INBOX, record('A', { partitionKey: 'order:1' }));
        await eventually(async () => (await waitingOnLocks()) === 1, 'A waiting');
        const receivedB = store.receive(INBOX, record('B', { partitionKey: 'order:1' }));
        await Promise.race([receivedB, new Promise((resolve) => setTimeout(resolve, 300))]);

        let claimedFirst!: () => void;
        const called = new Promise<void>((resolve) => (claimedFirst = resolve));
        first = store.claim(INBOX, { limit: 10, now: Date.now(), ordered: true }, async (batch) => {
          handed.push(batch.records.map((each) => each.id));
          claimedFirst();
          await gate;
          return [];
        });
        await Promise.race([first, called]);

        await holder.query('ROLLBACK');
        await expect(Promise.all([receivedA, receivedB])).resolves.toEqual(['added', 'added']);
        await store.claim(INBOX, { limit: 10, now: Date.now(), ordered: true }, async (batch) => {
          handed.push(batch.records.map((each) => each.id));
          return [];
        });
      } finally {
        open();
        await first;
        await holder.end();
      }
      expect(handed.flat()).toEqual(['A', 'B']);
    });

    it("refuses a release() of the transaction's client, which would hand the connection on mid-transaction", async () => {
      const released = store.transaction(async (tx) => {
        await store.append(BOX, [record('released?')], tx);
        const client = tx.client as PoolClient;
        expect(() => client.release()).toThrow(
          /the transaction's connection: it goes back to the pool when the transaction ends/,
        );
        // The client is the connection all the same: it runs statements in the transaction, which
        // has written (the append) and so holds a transaction id.
        const { rows } = await client.query<{ writing: boolean }>(
          'SELECT txid_current_if_assigned() IS NOT NULL AS writing',
        );
        expect(rows[0].writing).toBe(true);
      });
      await expect(released).resolves.toBeUndefined();
      expect(await store.get(BOX, 'released?')).toBeDefined();
    });

    it('refuses to append through a transaction that has settled', async () => {
      let settled: StoreTransaction | undefined;
      await store.transaction(async (tx) => {
        settled = tx;
      });
      await expect(store.append(BOX, [record('late')], settled!)).rejects.toBeInstanceOf(
        OutboxForeignTransactionError,
      );
    });

    it('rejects a transaction PostgreSQL rolled back at COMMIT (a failed statement whose error was caught), and nothing of it is written', async () => {
      const committing = store.transaction(async (tx) => {
        await store.append(BOX, [record('kept?')], tx);
        // The caller swallows a failing statement: PostgreSQL has aborted the transaction, and
        // answers the COMMIT with ROLLBACK, without an error of its own.
        await tx.query('SELECT 1 / 0').catch(() => undefined);
      });
      await expect(committing).rejects.toBeInstanceOf(PostgresOutboxError);
      await expect(committing).rejects.toThrow(/rolled the transaction back instead of committing/);
      expect(await store.get(BOX, 'kept?')).toBeUndefined();
      // The store goes on: the next transaction commits.
      await appendCommitted(['after']);
      expect(await store.get(BOX, 'after')).toBeDefined();
    });

    it('refuses a statement sent through a transaction once its work has resolved, instead of running it after the COMMIT', async () => {
      let stray: Promise<unknown> | undefined;
      await store.transaction(async (tx) => {
        await store.append(BOX, [record('inside')], tx);
        // Not awaited: runs once the work has resolved, while the store's COMMIT is in flight.
        stray = new Promise((resolve) => setImmediate(resolve))
          .then(() => store.append(BOX, [record('stray')], tx))
          .then(
            () => 'ran',
            (error: unknown) => error,
          );
      });
      expect(await stray).toBeInstanceOf(OutboxForeignTransactionError);
      expect(await store.get(BOX, 'inside')).toBeDefined();
      expect(await store.get(BOX, 'stray')).toBeUndefined();
    });

    it('refuses records it could not store, naming the record', async () => {
      await expect(
        store.transaction((tx) => store.append(BOX, [record('x'.repeat(201))], tx)),
      ).rejects.toThrow(/1 to 200 characters/);
      await expect(store.receive('inbox_events', record(''))).rejects.toBeInstanceOf(RangeError);
    });
    it('refuses partition keys and records out of the contract in lockPartitions and appendAtCommit, before sending anything', async () => {
      await store.transaction(async (tx) => {
        // A string is no list of keys (spread, it would lock one key per character).
        await expect(store.lockPartitions(BOX, 'Order:1' as never, tx)).rejects.toThrow(RangeError);
        await expect(store.lockPartitions(BOX, ['Order:1', 7] as never, tx)).rejects.toThrow(
          /lockPartitions: every one of keys must be a string, got 7/,
        );
        await expect(store.appendAtCommit(BOX, [record('')], tx)).rejects.toThrow(RangeError);
        // Nothing was sent: the transaction goes on.
        await store.append(BOX, [record('kept')], tx);
      });
      await expect(store.get(BOX, 'kept')).resolves.toMatchObject({ status: 'PENDING' });
      await expect(store.get(BOX, '')).rejects.toThrow(RangeError);
    });

    it('rejects an outcome for a record the claim did not hand out, writing nothing', async () => {
      await appendCommitted(['a']);
      await expect(
        store.claim(BOX, { limit: 1, now: Date.now() }, async () => [
          { id: 'a', status: 'completed' },
          { id: 'stranger', status: 'completed' },
        ]),
      ).rejects.toThrow(/stranger/);
      await expect(store.get(BOX, 'a')).resolves.toMatchObject({ status: 'PENDING', attempts: 0 });
    });

    it("with joinable: false, runs the handler outside the claim's transaction: a transaction() it opens commits on its own, whatever becomes of the claim", async () => {
      await appendCommitted(['claimed']);
      let inner: unknown;
      await expect(
        store.claim(BOX, { limit: 1, now: Date.now(), joinable: false }, async (batch) => {
          await store.transaction(async (tx) => {
            inner = tx;
            await store.append('outbox_commands', [record('written-alongside')], tx);
          });
          expect(inner).not.toBe(batch.transaction);
          throw new Error('the claim fails after its handler wrote');
        }),
      ).rejects.toThrow('the claim fails after its handler wrote');
      // Its own transaction: committed, though the claim rolled back.
      await expect(store.get('outbox_commands', 'written-alongside')).resolves.toMatchObject({
        status: 'PENDING',
      });
      await expect(store.get(BOX, 'claimed')).resolves.toMatchObject({
        status: 'PENDING',
        attempts: 0,
      });
    });

    it('refuses to run after close, saying so', async () => {
      await store.close();
      await expect(store.get(BOX, 'a')).rejects.toBeInstanceOf(OutboxStoreClosedError);
      await expect(store.transaction(async () => 1)).rejects.toBeInstanceOf(OutboxStoreClosedError);
    });
  });

  describe('over a pool of the caller', () => {
    let tablePrefix: string;
    let pool: Pool;
    let store: PostgresOutboxStore;

    beforeEach(async () => {
      tablePrefix = uniquePrefix();
      // One connection, and no waiting for it: a client leaked or handed back broken shows at
      // once as a failing next call.
      pool = postgresPool({ max: 1, connectionTimeoutMillis: 2_000 });
      store = new PostgresOutboxStore(pool, { tablePrefix });
      await store.migrate();
      await store.transaction((tx) => store.append(BOX, [record('a'), record('b')], tx));
    });

    afterEach(async () => {
      await store.close();
      await pool.end();
      created.add(tablePrefix);
    });

    const completeAll = async (batch: ClaimedBatch): Promise<RecordOutcome[]> =>
      batch.records.map((each) => ({ id: each.id, status: 'completed' }));

    it('writes nothing of a transaction rolled back while its first statements still go one by one', async () => {
      // A connection that has prepared nothing: BEGIN and a deferred append go one at a time.
      const fresh = postgresPool({ max: 1 });
      const own = new PostgresOutboxStore(fresh, { tablePrefix });
      try {
        await expect(
          own.transaction(async (tx) => {
            await own.appendAtCommit(BOX, [record('rolled-back')], tx);
            void tx.client; // hands the client out: sends BEGIN and the append
            throw new Error('validation failed');
          }),
        ).rejects.toThrow('validation failed');

        await expect(own.transaction(async () => 'next')).resolves.toBe('next');
        expect(await store.get(BOX, 'rolled-back')).toBeUndefined();
      } finally {
        await own.close();
        await fresh.end();
      }
    });

    it('rejects a claim whose connection is killed mid-handle, leaving its records PENDING', async () => {
      let pid = 0;
      const claim = store.claim(BOX, { limit: 10, now: Date.now() }, async (batch) => {
        const { rows } = await batch.transaction.query<{ pid: number }>(
          'SELECT pg_backend_pid() AS pid',
        );
        pid = rows[0].pid;
        await adminQuery('SELECT pg_terminate_backend($1)', [pid]);
        return completeAll(batch);
      });

      await expect(claim).rejects.toThrow();
      for (const id of ['a', 'b']) {
        await expect(store.get(BOX, id)).resolves.toMatchObject({ status: 'PENDING', attempts: 0 });
      }
      // The killed connection is gone from the server and from the pool (destroyed, not
      // returned): the next claim runs on a new connection.
      const alive = await adminQuery('SELECT 1 FROM pg_stat_activity WHERE pid = $1', [pid]);
      expect(alive).toEqual([]);
      await expect(
        store.claim(BOX, { limit: 10, now: Date.now() }, completeAll),
      ).resolves.toMatchObject({ claimed: 2, completed: 2 });
      expect(pool.totalCount).toBe(1);
    });

    it('rejects a transaction whose connection is killed, and goes on with a new connection', async () => {
      await expect(
        store.transaction(async (tx) => {
          const { rows } = await tx.query<{ pid: number }>('SELECT pg_backend_pid() AS pid');
          await adminQuery('SELECT pg_terminate_backend($1)', [rows[0].pid]);
          await store.append(BOX, [record('lost')], tx);
        }),
      ).rejects.toThrow();
      await expect(store.get(BOX, 'lost')).resolves.toBeUndefined();
      await expect(store.ping()).resolves.toBeUndefined();
    });

    /**
     * A store on a pool of one connection whose statements time out after `queryTimeoutMs`, and
     * `lock()` / `unlock()` of the box's table from another connection: what a connection that
     * stops answering looks like to the client (a failover, a half-open TCP connection).
     */
    async function withUnansweringBox(
      queryTimeoutMs: number,
      test: (fixture: {
        timed: Pool;
        timedStore: PostgresOutboxStore;
        lock: () => Promise<void>;
        unlock: () => Promise<void>;
      }) => Promise<void>,
    ): Promise<void> {
      const timed = postgresPool({ max: 1, query_timeout: queryTimeoutMs });
      const timedStore = new PostgresOutboxStore(timed, { tablePrefix });
      const locker = postgresClient();
      await locker.connect();
      const lock = async () => {
        await locker.query('BEGIN');
        await locker.query(`LOCK TABLE ${tablePrefix}${BOX} IN ACCESS EXCLUSIVE MODE`);
      };
      const unlock = async () => {
        await locker.query('ROLLBACK');
      };
      try {
        await test({ timed, timedStore, lock, unlock });
      } finally {
        await locker.query('ROLLBACK').catch(() => undefined);
        await locker.end();
        await timedStore.close();
        await timed.end();
      }
    }

    it('rejects a claim whose statement outlives the query_timeout, without waiting for PostgreSQL, and goes on', async () => {
      // Here a lock the claim's SELECT waits behind.
      await withUnansweringBox(300, async ({ timed, timedStore, lock, unlock }) => {
        await lock();
        let settled = false;
        const claim = timedStore.claim(BOX, { limit: 10, now: Date.now() }, completeAll);
        claim.then(
          () => (settled = true),
          () => (settled = true),
        );
        // Settled while the lock is still held: the client gave up on the statement and was
        // destroyed. Before, the ROLLBACK queued behind the statement that never answered.
        for (let waited = 0; waited < 5_000 && !settled; waited += 50) {
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
        expect(settled).toBe(true);
        await expect(claim).rejects.toThrow(/Query read timeout/);
        await unlock();
        await expect(
          timedStore.claim(BOX, { limit: 10, now: Date.now() }, completeAll),
        ).resolves.toMatchObject({ claimed: 2, completed: 2 });
        expect(timed.totalCount).toBe(1);

        // Inside a transaction: once a statement timed out, the next is refused at once with
        // that error, rather than sent to wait behind the one the client is still busy with.
        await lock();
        const errors: unknown[] = [];
        await timedStore
          .transaction(async (tx) => {
            await tx
              .query(`SELECT 1 FROM ${tablePrefix}${BOX}`)
              .catch((e: unknown) => errors.push(e));
            await tx.query('SELECT 1').catch((e: unknown) => errors.push(e));
          })
          .catch(() => undefined);
        expect(errors).toHaveLength(2);
        expect(errors[1]).toBe(errors[0]);
        await unlock();
      });
    });

    it('sends no ROLLBACK behind a statement that timed out, when the work threw an error of its own', async () => {
      await withUnansweringBox(1_000, async ({ timedStore, lock, unlock }) => {
        await lock();
        let thrownAt = 0;
        const transaction = timedStore.transaction(async (tx) => {
          await tx.query(`SELECT 1 FROM ${tablePrefix}${BOX}`).catch(() => {
            thrownAt = Date.now();
            throw new Error('order service unavailable'); // the application's own error
          });
        });

        await expect(transaction).rejects.toThrow('order service unavailable');
        // Before, a ROLLBACK was sent and waited a second query_timeout behind the statement.
        expect(Date.now() - thrownAt).toBeLessThan(500);
        await unlock();
        await expect(
          timedStore.claim(BOX, { limit: 10, now: Date.now() }, completeAll),
        ).resolves.toMatchObject({ claimed: 2, completed: 2 });
      });
    });

    it('rolls back a transaction whose work caught a statement timing out, even when that statement ends', async () => {
      const marks = `${tablePrefix}marks`;
      await pool.query(`CREATE TABLE ${marks} (v integer)`);
      try {
        await withUnansweringBox(300, async ({ timedStore }) => {
          const locker = postgresClient();
          await locker.connect();
          try {
            await locker.query('BEGIN');
            await locker.query(`LOCK TABLE ${marks} IN ACCESS EXCLUSIVE MODE`);
            // Let go once the insert timed out on the client (300 ms), while the COMMIT a
            // transaction that ignored its error would have queued behind it is still waiting
            // (its own timeout ends 300 ms later): PostgreSQL then runs the insert, and the COMMIT.
            setTimeout(() => void locker.query('COMMIT'), 450);
            const caught: unknown[] = [];
            const outcome = timedStore.transaction(async (tx) => {
              await tx.query(`INSERT INTO ${marks} (v) VALUES (1)`).catch((error: unknown) => {
                caught.push(error); // "an optional write": carries on
              });
              return 'done';
            });

            await expect(outcome).rejects.toThrow(/Query read timeout/);
            expect(caught).toHaveLength(1);
            await new Promise((resolve) => setTimeout(resolve, 700));
            expect((await pool.query(`SELECT v FROM ${marks}`)).rows).toEqual([]);
          } finally {
            await locker.query('ROLLBACK').catch(() => undefined);
            await locker.end();
          }
        });
      } finally {
        await pool.query(`DROP TABLE ${marks}`);
      }
    });

    it('does not exhaust its pool however many claims fail', async () => {
      for (let attempt = 0; attempt < 20; attempt++) {
        await expect(
          store.claim(BOX, { limit: 1, now: Date.now() }, async () => {
            throw new Error(`handler fails, attempt ${attempt}`);
          }),
        ).rejects.toThrow('handler fails');
        await expect(
          store.claim(BOX, { limit: 1, now: Date.now() }, async (batch) => [
            { id: batch.records[0].id, status: 'unknown' } as never,
          ]),
        ).rejects.toThrow(/status "unknown"/);
      }
      await expect(
        store.claim(BOX, { limit: 10, now: Date.now() }, completeAll),
      ).resolves.toMatchObject({ completed: 2 });
      expect(pool.waitingCount).toBe(0);
    });

    it("leaves no 'error' listener of its own on a client it hands back after announcing commits", async () => {
      const listening = postgresClient();
      await listening.connect();
      try {
        await listening.query(`LISTEN "${store.notifyChannel}"`);
        for (let commit = 0; commit < 12; commit++) {
          const announced = new Promise((resolve) => listening.once('notification', resolve));
          await store.transaction((tx) => store.append(BOX, [record(`n${commit}`)], tx));
          await announced; // the NOTIFY's transaction has committed on the pool's one client
        }
      } finally {
        await listening.end();
      }
      const client = await pool.connect();
      try {
        expect(client.listenerCount('error')).toBe(0);
      } finally {
        client.release();
      }
    });

    it('announces commits on its LISTEN connection, and takes no wake-up from hearing its own', async () => {
      // Tables of their own: no announcement of the setup's commit on this channel.
      const own = new PostgresOutboxStore(pool, { tablePrefix: uniquePrefix() });
      const listening = postgresClient();
      try {
        await own.migrate();
        const woken: string[] = [];
        await own.watch((box) => void woken.push(box));
        await listening.connect();
        await listening.query(`LISTEN "${own.notifyChannel}"`);
        const heard = new Promise<Notification>((resolve) =>
          listening.once('notification', resolve),
        );

        await own.transaction((tx) => own.append(BOX, [record('announced')], tx));

        const [{ pid }] = await adminQuery<{ pid: number }>(
          'SELECT pid FROM pg_stat_activity WHERE application_name = $1',
          [own.listenerApplicationName],
        );
        expect((await heard).processId).toBe(pid);
        // Delivered after the announcement to every listener: once the store hears it, it has
        // heard its own announcement too.
        await listening.query(`NOTIFY "${own.notifyChannel}", 'outbox_commands'`);
        await eventually(() => woken.includes('outbox_commands'), 'the later notification');
        expect(woken.filter((box) => box === BOX)).toEqual([BOX]); // at the commit, only
      } finally {
        await listening.end().catch(() => undefined);
        await own.close();
        created.add(own.tablePrefix);
      }
    });

    it('uses the pool and leaves it open on close', async () => {
      await store.close();
      const { rows } = await pool.query(`SELECT id FROM ${tablePrefix}${BOX} ORDER BY seq`);
      expect(rows).toEqual([{ id: 'a' }, { id: 'b' }]);
      expect(pool.ended).toBe(false);
    });
  });
});
