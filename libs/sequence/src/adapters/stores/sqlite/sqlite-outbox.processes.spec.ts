import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { OutboxStoreBusyError } from '../../../core/errors/outbox-store-busy.error';
import type { NewBoxRecord } from '../../../ports/outbox-store.port';
import { SqliteOutboxStore } from './sqlite.outbox-store';

const BOX = 'outbox_events';
const PREFIX = 'app_';

function record(id: string): NewBoxRecord {
  return { id, kind: 'event', type: 'OrderPlaced', partitionKey: null, body: '{}', headers: {} };
}

/**
 * Another process on the same file: opens it, runs `BEGIN IMMEDIATE` and `sql` (holding the write
 * lock), says `locked`, and commits after `holdMs` (never, when null: it waits to be killed).
 */
function lockHolder(filename: string, sql: string, holdMs: number | null) {
  const script = `
    const Database = require(${JSON.stringify(require.resolve('better-sqlite3'))});
    const database = new Database(${JSON.stringify(filename)});
    database.exec('BEGIN IMMEDIATE');
    database.exec(${JSON.stringify(sql)});
    process.stdout.write('locked\\n');
    const hold = ${JSON.stringify(holdMs)};
    if (hold === null) setInterval(() => {}, 1000);
    else setTimeout(() => { database.exec('COMMIT'); database.close(); }, hold);
  `;
  const child: ChildProcess = spawn(process.execPath, ['-e', script], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const locked = new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (chunk: Buffer) => {
      if (chunk.toString().includes('locked')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`lock holder exited (${code}) before locking`)));
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  return { child, locked, exited };
}

/** Counts timer ticks: a process whose event loop is blocked counts none. */
function tickCounter(): { ticks(): number; stop(): void } {
  let ticks = 0;
  const timer = setInterval(() => (ticks += 1), 10);
  return { ticks: () => ticks, stop: () => clearInterval(timer) };
}

describe('SqliteOutboxStore with another process on the same file', () => {
  let directory: string;
  let filename: string;
  let store: SqliteOutboxStore;
  let holder: ReturnType<typeof lockHolder> | undefined;

  async function openStore(busyTimeoutMs?: number): Promise<SqliteOutboxStore> {
    store = await SqliteOutboxStore.open({ filename, tablePrefix: PREFIX, busyTimeoutMs });
    await store.migrate();
    return store;
  }

  beforeEach(() => {
    directory = mkdtempSync(join(tmpdir(), 'nseq-sqlite-outbox-'));
    filename = join(directory, 'outbox.db');
  });

  afterEach(async () => {
    if (holder) {
      holder.child.kill('SIGKILL');
      await holder.exited;
      holder = undefined;
    }
    await store.close();
    rmSync(directory, { recursive: true, force: true });
  });

  it('makes a transaction wait for the write lock, without blocking the event loop, then commit', async () => {
    await openStore();
    holder = lockHolder(filename, 'CREATE TABLE held (x INTEGER)', 500);
    await holder.locked;
    const counter = tickCounter();
    const started = Date.now();

    await store.transaction((tx) => store.append(BOX, [record('after-the-wait')], tx));

    const waited = Date.now() - started;
    counter.stop();
    expect(waited).toBeGreaterThanOrEqual(300);
    expect(counter.ticks()).toBeGreaterThan(waited / 10 / 3);
    await expect(store.get(BOX, 'after-the-wait')).resolves.toMatchObject({ status: 'PENDING' });
  });

  it('fails with OutboxStoreBusyError when the lock is held longer than busyTimeoutMs', async () => {
    await openStore(100);
    holder = lockHolder(filename, 'CREATE TABLE held (x INTEGER)', 500);
    await holder.locked;
    const started = Date.now();

    const attempt = store.transaction((tx) => store.append(BOX, [record('too-late')], tx));

    await expect(attempt).rejects.toBeInstanceOf(OutboxStoreBusyError);
    await expect(attempt).rejects.toMatchObject({
      code: 'outbox-store-busy',
      operation: 'BEGIN IMMEDIATE',
    });
    await expect(attempt).rejects.toThrow(/another process/);
    expect(Date.now() - started).toBeLessThan(450);
    await holder.exited;
    // Nothing was run, and the store goes on once the lock is free.
    await expect(store.get(BOX, 'too-late')).resolves.toBeUndefined();
    await store.transaction((tx) => store.append(BOX, [record('later')], tx));
    await expect(store.get(BOX, 'later')).resolves.toMatchObject({ status: 'PENDING' });
  });

  it('reads while the other process writes, without seeing its uncommitted records (WAL)', async () => {
    // A read that waited for the other process's lock would fail with OutboxStoreBusyError after
    // 100 ms: that process never commits.
    await openStore(100);
    holder = lockHolder(
      filename,
      // More than its page cache holds (2 pages): without WAL, writing the excess to the file
      // takes the exclusive lock, which keeps readers out until the transaction ends.
      `PRAGMA cache_size = 2;
       INSERT INTO ${PREFIX}${BOX} (id, kind, type, body, headers, status, attempts, next_attempt_at, created_at)
       VALUES ('uncommitted', 'event', 'T', '{}', '{}', 'PENDING', 0, 0, 0);
       CREATE TABLE filler (x BLOB);
       INSERT INTO filler WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
       SELECT randomblob(1000) FROM n;`,
      null,
    );
    await holder.locked;
    await expect(store.stats(BOX)).resolves.toMatchObject({ pending: 0 });
    await expect(store.get(BOX, 'uncommitted')).resolves.toBeUndefined();
  });

  it('goes on when a process dies inside its transaction, which leaves nothing behind', async () => {
    await openStore(5_000);
    holder = lockHolder(
      filename,
      `INSERT INTO ${PREFIX}${BOX} (id, kind, type, body, headers, status, attempts, next_attempt_at, created_at)
       VALUES ('never-committed', 'event', 'T', '{}', '{}', 'PENDING', 0, 0, 0)`,
      null,
    );
    await holder.locked;
    const started = Date.now();
    const claim = store.claim(BOX, { limit: 10, now: Date.now() }, async () => []);
    setTimeout(() => holder?.child.kill('SIGKILL'), 100);

    await expect(claim).resolves.toMatchObject({ claimed: 0 });
    expect(Date.now() - started).toBeLessThan(2_000);
    await expect(store.get(BOX, 'never-committed')).resolves.toBeUndefined();
  });
});
