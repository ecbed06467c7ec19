import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { describeOutboxStoreConformance } from '../../../testing/conformance/outbox-store.conformance';
import { record } from '../../../testing/conformance/outbox-store/outbox-suite.context';
import { OutboxForeignTransactionError } from '../../../core/errors/outbox-foreign-transaction.error';
import { OutboxStoreClosedError } from '../../../core/errors/outbox-store-closed.error';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import {
  BOX_NAMES,
  type ClaimResult,
  type OutboxStore,
  type RecordOutcome,
  type StoreTransaction,
} from '../../../ports/outbox-store.port';
import {
  SQLITE_MAX_LENGTH_BYTES,
  SqliteOutboxError,
  SqliteRecordTooLargeError,
} from './sqlite-outbox.error';
import { appendParameters, tooLargeError } from './sqlite-outbox.codec';
import { SqliteOutboxStore } from './sqlite.outbox-store';

const BOX = 'outbox_events';

function uniquePrefix(): string {
  return `t${randomBytes(4).toString('hex')}_`;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** A directory of its own per test, deleted (database, -wal and -shm files) after it. */
function temporaryDirectories(): () => string {
  const made: string[] = [];
  afterEach(() => {
    for (const directory of made.splice(0)) rmSync(directory, { recursive: true, force: true });
  });
  return () => {
    const directory = mkdtempSync(join(tmpdir(), 'nseq-sqlite-outbox-'));
    made.push(directory);
    return directory;
  };
}

describe('SqliteOutboxStore', () => {
  describe('conformance', () => {
    /** The file and prefix of each store the harness created (peers are not in it). */
    const created = new Map<
      OutboxStore,
      { directory: string; filename: string; tablePrefix: string }
    >();

    describeOutboxStoreConformance('sqlite', {
      create: async () => {
        const directory = mkdtempSync(join(tmpdir(), 'nseq-sqlite-outbox-'));
        const filename = join(directory, 'outbox.db');
        const tablePrefix = uniquePrefix();
        const store = await SqliteOutboxStore.open({ filename, tablePrefix });
        await store.migrate();
        created.set(store, { directory, filename, tablePrefix });
        return store;
      },
      // Another process would open the same file: a connection of its own.
      peer: async (store) => {
        const { filename, tablePrefix } = created.get(store)!;
        return SqliteOutboxStore.open({ filename, tablePrefix });
      },
      close: async (store) => {
        await store.close();
        const made = created.get(store);
        if (!made) return;
        created.delete(store);
        rmSync(made.directory, { recursive: true, force: true });
      },
    });
  });

  describe('on a file', () => {
    const directory = temporaryDirectories();
    let filename: string;
    const stores: SqliteOutboxStore[] = [];

    async function open(
      options: {
        busyTimeoutMs?: number;
        synchronous?: 'FULL' | 'NORMAL';
        tablePrefix?: string;
      } = {},
    ) {
      const store = await SqliteOutboxStore.open({ filename, tablePrefix: 'app_', ...options });
      stores.push(store);
      return store;
    }

    beforeEach(() => {
      filename = join(directory(), 'outbox.db');
    });

    afterEach(async () => {
      for (const store of stores.splice(0)) await store.close();
    });

    it('keeps records across close and reopen, and never reuses a seq', async () => {
      const first = await open();
      await first.migrate();
      await first.transaction((tx) => first.append(BOX, [record('a'), record('b')], tx));
      await first.claim(BOX, { limit: 10, now: Date.now() }, async (batch) =>
        batch.records.map(({ id }) => ({ id, status: 'completed' as const })),
      );
      await first.purge(BOX, { completedBefore: Date.now() + 1_000, batchSize: 10 });
      await first.close();

      const reopened = await open();
      await reopened.migrate();
      await expect(reopened.get(BOX, 'a')).resolves.toBeUndefined();
      await reopened.transaction((tx) => reopened.append(BOX, [record('c')], tx));
      const c = await reopened.get(BOX, 'c');
      // a and b had seqs 1 and 2, purged: AUTOINCREMENT does not hand them out again.
      expect(c).toMatchObject({ id: 'c', seq: 3, status: 'PENDING' });
    });

    it('records migration 1 once, with the four box tables and their indexes', async () => {
      const store = await open();
      await store.migrate();
      await store.migrate();
      const inspect = new Database(filename, { readonly: true });
      try {
        expect(inspect.prepare('SELECT version, name FROM app_outbox_migrations').all()).toEqual([
          { version: 1, name: 'outbox_boxes' },
        ]);
        const names = (
          inspect.prepare('SELECT name FROM sqlite_schema').all() as { name: string }[]
        ).map(({ name }) => name);
        for (const box of BOX_NAMES) {
          expect(names).toEqual(
            expect.arrayContaining([
              `app_${box}`,
              `app_${box}_due`,
              `app_${box}_open_partitions`,
              `app_${box}_completed`,
              `app_${box}_failed`,
            ]),
          );
        }
      } finally {
        inspect.close();
      }
    });

    it('opens the file in WAL mode, synchronous FULL unless asked for NORMAL', async () => {
      const full = await open();
      const normal = await SqliteOutboxStore.open({ filename, synchronous: 'NORMAL' });
      stores.push(normal);
      const mode = (store: SqliteOutboxStore) =>
        store.transaction(async (tx) => [
          (tx.client as Database.Database).pragma('journal_mode', { simple: true }),
          (tx.client as Database.Database).pragma('synchronous', { simple: true }),
        ]);
      // synchronous: 2 is FULL, 1 NORMAL.
      await expect(mode(full)).resolves.toEqual(['wal', 2]);
      await expect(mode(normal)).resolves.toEqual(['wal', 1]);
    });

    it('wakes the listeners of another store on the same file in this process', async () => {
      const store = await open();
      await store.migrate();
      const other = await open();
      const woken: string[] = [];
      const unsubscribe = await store.watch((box) => woken.push(box));
      await other.receive('inbox_commands', record('cmd-1', { kind: 'command' }));
      const deadline = Date.now() + 2_000;
      while (!woken.includes('inbox_commands') && Date.now() < deadline) await sleep(5);
      expect(woken).toContain('inbox_commands');
      await unsubscribe();
    });

    it('wakes the listeners of a store whose prefix differs only in case (the same tables)', async () => {
      const store = await open();
      await store.migrate();
      const other = await open({ tablePrefix: 'App_' });
      const woken: string[] = [];
      const unsubscribe = await store.watch((box) => woken.push(box));
      await other.receive('inbox_commands', record('cmd-1', { kind: 'command' }));
      const deadline = Date.now() + 200;
      while (!woken.includes('inbox_commands') && Date.now() < deadline) await sleep(5);
      expect((await store.get('inbox_commands', 'cmd-1'))?.id).toBe('cmd-1');
      expect(woken).toContain('inbox_commands');
      await unsubscribe();
    });

    it('does not wake listeners for what a rolled-back savepoint appended', async () => {
      const store = await open();
      await store.migrate();
      const woken: string[] = [];
      const unsubscribe = await store.watch((box) => woken.push(box));
      await store.transaction(async (tx) => {
        await expect(
          tx.savepoint(async () => {
            await store.append('outbox_commands', [record('undone', { kind: 'command' })], tx);
            throw new Error('undo');
          }),
        ).rejects.toThrow('undo');
        await store.append(BOX, [record('kept')], tx);
      });
      const deadline = Date.now() + 2_000;
      while (!woken.includes(BOX) && Date.now() < deadline) await sleep(5);
      await sleep(50);
      expect(woken).toEqual([BOX]);
      await unsubscribe();
    });
  });

  describe('in memory', () => {
    it('works on a database of its own, which another store does not see', async () => {
      const store = await SqliteOutboxStore.open({ filename: ':memory:' });
      const other = await SqliteOutboxStore.open({ filename: ':memory:' });
      try {
        await store.migrate();
        await other.migrate();
        await store.transaction((tx) => store.append(BOX, [record('m-1')], tx));
        const handed: string[] = [];
        await store.claim(BOX, { limit: 10, now: 0 }, async (batch) => {
          handed.push(...batch.records.map(({ id }) => id));
          return [];
        });
        expect(handed).toEqual(['m-1']);
        await expect(other.get(BOX, 'm-1')).resolves.toBeUndefined();
      } finally {
        await store.close();
        await other.close();
      }
    });
  });

  describe("over the application's Database", () => {
    let database: Database.Database;

    beforeEach(() => {
      database = new Database(':memory:');
    });

    afterEach(() => {
      database.close();
    });

    it('leaves the database open on close', async () => {
      const store = new SqliteOutboxStore(database);
      await store.migrate();
      await store.close();
      expect(database.open).toBe(true);
      expect(database.prepare('SELECT count(*) AS n FROM outbox_events').get()).toEqual({ n: 0 });
    });

    it('shares one connection discipline between stores over it: overlapping transactions take turns', async () => {
      const orders = new SqliteOutboxStore(database, { tablePrefix: 'orders_' });
      const billing = new SqliteOutboxStore(database, { tablePrefix: 'billing_' });
      await orders.migrate();
      await billing.migrate();
      await Promise.all(
        [orders, billing, orders, billing].map((store, index) =>
          store.transaction(async (tx) => {
            await store.append(BOX, [record(`r-${index}-a`)], tx);
            await sleep(2);
            await store.append(BOX, [record(`r-${index}-b`)], tx);
          }),
        ),
      );
      await expect(orders.stats(BOX)).resolves.toMatchObject({ pending: 4 });
      await expect(billing.stats(BOX)).resolves.toMatchObject({ pending: 4 });
      // Same connection, same transaction: one store may append in the other's.
      await orders.transaction((tx) => billing.append(BOX, [record('joint')], tx));
      await expect(billing.get(BOX, 'joint')).resolves.toMatchObject({ status: 'PENDING' });
      await orders.close();
      await billing.close();
    });

    it('answers numbers when the database reads integers as BigInt (defaultSafeIntegers)', async () => {
      database.defaultSafeIntegers(true);
      const store = new SqliteOutboxStore(database);
      await store.migrate();
      await store.transaction((tx) => store.append(BOX, [record('r-1')], tx));
      const claimed = await store.claim(BOX, { limit: 10, now: 1_000 }, async (batch) => {
        expect(typeof batch.records[0].seq).toBe('number');
        return [{ id: 'r-1', status: 'retry', nextAttemptAt: 2_000, error: 'again' }];
      });
      expect(claimed).toEqual({ claimed: 1, completed: 0, retried: 1, failed: 0 });
      const stored = await store.get(BOX, 'r-1');
      for (const field of ['seq', 'attempts', 'nextAttemptAt', 'createdAt'] as const) {
        expect(typeof stored![field]).toBe('number');
      }
      expect(stored).toMatchObject({ attempts: 1, nextAttemptAt: 2_000 });
      await expect(store.stats(BOX)).resolves.toEqual({
        pending: 1,
        failed: 0,
        oldestPendingAt: stored!.createdAt,
      });
      // The application's own statements keep its setting.
      await expect(
        store.transaction((tx) => tx.query('SELECT count(*) AS n FROM outbox_events')),
      ).resolves.toEqual({ rows: [{ n: 1n }], rowCount: 1 });
      await store.close();
    });
  });

  describe('refuses', () => {
    let store: SqliteOutboxStore;

    beforeEach(async () => {
      store = await SqliteOutboxStore.open({ filename: ':memory:' });
      await store.migrate();
    });

    afterEach(async () => {
      await store.close();
    });

    it("a SqlExecutor, saying that joining the caller's transaction is PostgreSQL-only", async () => {
      const executor = { query: async () => ({ rows: [] }) };
      const refusal = store.append(BOX, [record('x')], executor);
      await expect(refusal).rejects.toBeInstanceOf(OutboxForeignTransactionError);
      await expect(refusal).rejects.toMatchObject({
        code: 'outbox-foreign-transaction',
        reason: 'executor',
      });
      await expect(refusal).rejects.toThrow(/PostgreSQL only/);
      await expect(store.get(BOX, 'x')).resolves.toBeUndefined();
    });

    it("another store's transaction", async () => {
      const other = await SqliteOutboxStore.open({ filename: ':memory:' });
      await other.migrate();
      try {
        await expect(
          other.transaction((tx) => store.append(BOX, [record('x')], tx)),
        ).rejects.toMatchObject({ code: 'outbox-foreign-transaction', reason: 'other-store' });
      } finally {
        await other.close();
      }
    });

    it('a transaction that has settled', async () => {
      let kept: StoreTransaction | undefined;
      await store.transaction(async (tx) => {
        kept = tx;
      });
      await expect(store.append(BOX, [record('late')], kept!)).rejects.toMatchObject({
        reason: 'settled',
      });
      await expect(kept!.query('SELECT 1')).rejects.toThrow(/already committed or rolled back/);
      await expect(kept!.query('SELECT 1')).rejects.toBeInstanceOf(SqliteOutboxError);
    });

    it('a record larger than SQLite takes in a row, with SqliteRecordTooLargeError naming the limit', async () => {
      // Two UTF-8 bytes a character, one byte each in memory: just over the limit in bytes.
      const body = 'é'.repeat(Math.floor(SQLITE_MAX_LENGTH_BYTES / 2) + 1);
      const refusals = [
        () =>
          store.transaction((tx) =>
            store.append(BOX, [record('small'), record('huge', { body })], tx),
          ),
        () => store.receive('inbox_events', record('huge', { body })),
      ];
      for (const refuse of refusals) {
        const refused = await refuse().catch((error: unknown) => error);
        expect(refused).toBeInstanceOf(SqliteRecordTooLargeError);
        expect(refused).toMatchObject({
          code: 'sqlite-record-too-large',
          id: 'huge',
          limitBytes: SQLITE_MAX_LENGTH_BYTES,
          bytes: expect.any(Number),
          message: expect.stringContaining(`limit of ${SQLITE_MAX_LENGTH_BYTES} bytes`),
        });
        expect((refused as SqliteRecordTooLargeError).bytes).toBeGreaterThan(
          SQLITE_MAX_LENGTH_BYTES,
        );
      }
      // The transaction rolled back whole: nor the record before it.
      await expect(store.get(BOX, 'small')).resolves.toBeUndefined();
      await expect(store.get('inbox_events', 'huge')).resolves.toBeUndefined();
    });

    it("names SQLite's own SQLITE_TOOBIG for a record as SqliteRecordTooLargeError too", () => {
      const database = new Database(':memory:');
      let tooBig: unknown;
      try {
        // SQLite refuses the blob before making it: its error, at no cost.
        database.prepare('SELECT zeroblob(?)').get(SQLITE_MAX_LENGTH_BYTES + 1);
      } catch (error) {
        tooBig = error;
      } finally {
        database.close();
      }
      expect(tooBig).toMatchObject({ code: 'SQLITE_TOOBIG' });
      const parameters = appendParameters(BOX, record('row'), 0);

      expect(tooLargeError(tooBig, BOX, parameters)).toMatchObject({
        name: 'SqliteRecordTooLargeError',
        box: BOX,
        id: 'row',
        cause: tooBig,
      });
      expect(tooLargeError(new Error('disk I/O error'), BOX, parameters)).toBeUndefined();
    });

    it('to receive inside its own transaction, with SqliteOutboxError', async () => {
      await store.transaction(async () => {
        const refusal = store.receive('inbox_events', record('in-tx'));
        await expect(refusal).rejects.toBeInstanceOf(SqliteOutboxError);
        await expect(refusal).rejects.toThrow(/called inside a transaction/);
      });
    });

    it('invalid options', async () => {
      await expect(
        SqliteOutboxStore.open({ filename: ':memory:', tablePrefix: 'no-dashes' }),
      ).rejects.toThrow(SequenceOptionsError);
      await expect(
        SqliteOutboxStore.open({ filename: ':memory:', busyTimeoutMs: -1 }),
      ).rejects.toThrow(SequenceOptionsError);
    });

    it.each([
      ['undefined', undefined],
      ['null', null],
      ['empty', ''],
      ['a number', 42],
    ])(
      'a filename that is %s (rather than opening a temporary database lost on close)',
      async (_what, filename) => {
        const opening = SqliteOutboxStore.open({ filename: filename as unknown as string });
        await expect(opening).rejects.toThrow(SequenceOptionsError);
        await expect(opening).rejects.toThrow(/filename must be/);
      },
    );

    it('outcomes for records the claim did not hand out, leaving the batch untouched', async () => {
      await store.transaction((tx) => store.append(BOX, [record('mine')], tx));
      await expect(
        store.claim(BOX, { limit: 10, now: 0 }, async () => [
          { id: 'mine', status: 'completed' },
          { id: 'someone-else', status: 'completed' },
        ]),
      ).rejects.toThrow(/did not hand out/);
      await expect(store.get(BOX, 'mine')).resolves.toMatchObject({
        status: 'PENDING',
        attempts: 0,
      });
    });

    it('every call after close, with OutboxStoreClosedError', async () => {
      await store.close();
      await expect(store.ping()).rejects.toBeInstanceOf(OutboxStoreClosedError);
      await expect(store.transaction(async () => 1)).rejects.toBeInstanceOf(OutboxStoreClosedError);
      await expect(store.stats(BOX)).rejects.toBeInstanceOf(OutboxStoreClosedError);
      await expect(store.watch(() => undefined)).rejects.toBeInstanceOf(OutboxStoreClosedError);
    });

    it('to close from inside its own transaction (which it would wait for forever)', async () => {
      await store.transaction(async () => {
        await expect(store.close()).rejects.toThrow(/inside a transaction/);
        await expect(store.close()).rejects.toBeInstanceOf(SqliteOutboxError);
      });
      await expect(store.ping()).resolves.toBeUndefined();
    });
  });

  it('answers ping while a transaction is in progress', async () => {
    const store = await SqliteOutboxStore.open({ filename: ':memory:' });
    let finish!: () => void;
    const held = new Promise<void>((resolve) => (finish = resolve));
    const transaction = store.transaction(() => held);
    await sleep(5);
    const answered = await Promise.race([store.ping().then(() => 'answered'), sleep(200)]);
    expect(answered).toBe('answered');
    finish();
    await transaction;
    await store.close();
  });

  it('closes after the transaction in progress commits', async () => {
    const store = await SqliteOutboxStore.open({ filename: ':memory:' });
    await store.migrate();
    const database = await store.transaction(async (tx) => tx.client as Database.Database);
    let finish!: () => void;
    const held = new Promise<void>((resolve) => (finish = resolve));
    const transaction = store.transaction(async (tx) => {
      await store.append(BOX, [record('in-flight')], tx);
      await held;
    });
    await sleep(5);
    let closed = false;
    const closing = store.close().then(() => (closed = true));
    await sleep(20);
    expect(closed).toBe(false);
    expect(database.open).toBe(true);
    finish();
    await transaction;
    await closing;
    expect(database.open).toBe(false);
  });

  describe("when SQLite ends a claim's transaction under its handler (the disk is full)", () => {
    const BOX_IN = 'inbox_commands';
    let database: Database.Database;
    let store: SqliteOutboxStore;

    beforeEach(async () => {
      database = new Database(':memory:', { timeout: 0 });
      store = new SqliteOutboxStore(database);
      await store.migrate();
      await store.transaction((tx) => tx.query('CREATE TABLE blobs (v TEXT)'));
      await store.receive(BOX_IN, record('cmd-1'));
      // SQLITE_FULL at the next page: SQLite then rolls the whole transaction back.
      database.pragma(
        `max_page_count = ${database.pragma('page_count', { simple: true }) as number}`,
      );
    });

    afterEach(async () => {
      await store.close();
      database.close();
    });

    /** A claim whose handler's write fills the disk; the handler gives `outcome` for cmd-1. */
    function claimFillingTheDisk(
      outcome: (error: string) => RecordOutcome,
    ): Promise<{ result: ClaimResult; brokenBy: Error | undefined }> {
      let brokenBy: Error | undefined;
      return store
        .claim(BOX_IN, { limit: 10, now: 1_000 }, async (batch) => {
          let error = '';
          try {
            await batch.transaction.query('INSERT INTO blobs VALUES (?)', ['x'.repeat(100_000)]);
          } catch (caught) {
            error = (caught as Error).message;
          }
          brokenBy = batch.transaction.brokenBy;
          return [outcome(error)];
        })
        .then((result) => ({ result, brokenBy }));
    }

    it('says so in brokenBy, and writes a retry outcome in a transaction of its own', async () => {
      const { result, brokenBy } = await claimFillingTheDisk((error) => ({
        id: 'cmd-1',
        status: 'retry',
        nextAttemptAt: 5_000,
        error,
      }));
      expect(brokenBy).toBeInstanceOf(Error);
      expect(result).toEqual({ claimed: 1, completed: 0, retried: 1, failed: 0 });
      await expect(store.get(BOX_IN, 'cmd-1')).resolves.toMatchObject({
        status: 'PENDING',
        attempts: 1,
        nextAttemptAt: 5_000,
        lastError: expect.stringMatching(/full/),
      });
    });

    it('writes a failed outcome, so that a record whose handling always fills the disk ends FAILED', async () => {
      const { result } = await claimFillingTheDisk((error) => ({
        id: 'cmd-1',
        status: 'failed',
        error,
      }));
      expect(result).toEqual({ claimed: 1, completed: 0, retried: 0, failed: 1 });
      await expect(store.get(BOX_IN, 'cmd-1')).resolves.toMatchObject({
        status: 'FAILED',
        attempts: 1,
      });
    });

    it('drops a completed outcome: what the handler did went with the transaction', async () => {
      const { result } = await claimFillingTheDisk(() => ({ id: 'cmd-1', status: 'completed' }));
      expect(result).toEqual({ claimed: 1, completed: 0, retried: 0, failed: 0 });
      await expect(store.get(BOX_IN, 'cmd-1')).resolves.toMatchObject({
        status: 'PENDING',
        attempts: 0,
      });
    });

    it('rolls a claim back whole when a savepoint of it could not be rolled back (still open)', async () => {
      database.pragma('max_page_count = 1073741823'); // no full disk in this case
      const claimed = store.claim(BOX_IN, { limit: 10, now: 1_000 }, async (batch) => {
        let iterator: IterableIterator<unknown> | undefined;
        await expect(
          store.transaction(async (nested) => {
            await nested.query("INSERT INTO blobs VALUES ('nested')");
            // An iterator left open refuses every statement, the savepoint's ROLLBACK TO too.
            iterator = database.prepare('SELECT v FROM blobs').iterate();
            iterator.next();
            throw new Error('nested fails');
          }),
        ).rejects.toThrow('nested fails');
        iterator!.return!();
        expect(batch.transaction.brokenBy).toBeInstanceOf(Error);
        return [{ id: 'cmd-1', status: 'completed' as const }];
      });
      // Its own error, not what a second transaction would meet on the connection.
      await expect(claimed).rejects.toThrow(/savepoint .* could not be rolled back/);
      await expect(claimed).rejects.toBeInstanceOf(SqliteOutboxError);
      await expect(store.get(BOX_IN, 'cmd-1')).resolves.toMatchObject({
        status: 'PENDING',
        attempts: 0,
      });
      const rows = await store.transaction((tx) => tx.query('SELECT v FROM blobs'));
      expect(rows.rows).toEqual([]);
    });
  });
});
