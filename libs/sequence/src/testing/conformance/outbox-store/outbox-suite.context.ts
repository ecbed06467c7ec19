import type {
  BoxName,
  ClaimedBatch,
  ClaimOptions,
  ClaimResult,
  NewBoxRecord,
  OutboxDialect,
  OutboxStore,
  RecordOutcome,
  SqlExecutor,
  StoreTransaction,
  StoredRecord,
} from '../../../ports/outbox-store.port';

/** A connection of the caller's own (PostgreSQL), for appends inside the caller's transaction. */
export interface ExternalConnection {
  readonly executor: SqlExecutor;
  release(): Promise<void>;
}

/**
 * What every part of the outbox-store conformance suite sees: replaced before each test (a fresh
 * store over tables of its own, a clock near the real one). Parts read it inside their tests
 * only, never while jest collects them.
 */
export interface OutboxSuiteContext {
  /** The store under test, migrated, over empty tables. */
  readonly store: OutboxStore;
  /** `Date.now()` when the test started: the times a test passes are relative to it. */
  readonly t0: number;
  /** The harness's `externalConnection` for the store (only called when the harness has one). */
  externalConnection(): Promise<ExternalConnection>;
  /** Another instance over the same tables; closed after the test. */
  peer(): Promise<OutboxStore>;
  /** A business table of this test's own (`id TEXT PRIMARY KEY, value TEXT`), dropped after it. */
  businessTable(): Promise<BusinessTable>;
}

/** The box most cases use; the others are covered by the cases about boxes. */
export const BOX: BoxName = 'outbox_events';

/** A table standing for the caller's business data, written in the same transactions. */
export interface BusinessTable {
  readonly name: string;
  /** Inserts a row through `transaction`. */
  insert(transaction: StoreTransaction, id: string, value: string): Promise<void>;
  /** The row's value as committed (read in a transaction of its own), or `undefined`. */
  read(id: string): Promise<string | undefined>;
}

/** `count` placeholders in the dialect's own spelling (`$1, $2` or `?, ?`). */
export function placeholders(dialect: OutboxDialect, count: number): string {
  return Array.from({ length: count }, (_, index) =>
    dialect === 'postgres' ? `$${index + 1}` : '?',
  ).join(', ');
}

export async function createBusinessTable(
  store: OutboxStore,
  name: string,
): Promise<BusinessTable> {
  await store.transaction((tx) =>
    tx.query(`CREATE TABLE ${name} (id TEXT PRIMARY KEY, value TEXT)`),
  );
  return {
    name,
    async insert(transaction, id, value) {
      const [first, second] = placeholders(transaction.dialect, 2).split(', ');
      await transaction.query(`INSERT INTO ${name} (id, value) VALUES (${first}, ${second})`, [
        id,
        value,
      ]);
    },
    async read(id) {
      const result = await store.transaction((tx) =>
        tx.query<{ value: string }>(
          `SELECT value FROM ${name} WHERE id = ${placeholders(tx.dialect, 1)}`,
          [id],
        ),
      );
      return result.rows[0]?.value;
    },
  };
}

/** A record whose body and headers name its id, so that a mix-up shows. */
export function record(id: string, overrides: Partial<NewBoxRecord> = {}): NewBoxRecord {
  return {
    id,
    kind: 'event',
    type: 'OrderPlaced',
    partitionKey: null,
    body: JSON.stringify({ orderId: id }),
    headers: { 'x-record': id },
    ...overrides,
  };
}

/** Records `prefix-1`..`prefix-count`. */
export function records(
  prefix: string,
  count: number,
  partitionKey: string | null = null,
): NewBoxRecord[] {
  return range(1, count).map((index) => record(`${prefix}-${index}`, { partitionKey }));
}

/** Appends `items` in a transaction of their own, committed; returns the ids added. */
export function appendCommitted(
  store: OutboxStore,
  box: BoxName,
  items: readonly NewBoxRecord[],
): Promise<string[]> {
  return store.transaction((tx) => store.append(box, items, tx));
}

export function idsOf(batch: ClaimedBatch | readonly StoredRecord[]): string[] {
  const list = 'records' in batch ? batch.records : batch;
  return list.map((each) => each.id);
}

export function completeAll(batch: ClaimedBatch): RecordOutcome[] {
  return batch.records.map((each) => ({ id: each.id, status: 'completed' }));
}

/** One claim, completing whatever it is handed; the ids it was handed (`[]` when none). */
export async function claimAndComplete(
  store: OutboxStore,
  box: BoxName,
  options: ClaimOptions,
): Promise<string[]> {
  const handed: string[] = [];
  await store.claim(box, options, async (batch) => {
    handed.push(...idsOf(batch));
    return completeAll(batch);
  });
  return handed;
}

/** One claim that gives every record it is handed `outcome`; the ids and the result. */
export async function claimWith(
  store: OutboxStore,
  box: BoxName,
  options: ClaimOptions,
  outcome: (record: StoredRecord) => RecordOutcome,
): Promise<{ handed: string[]; result: ClaimResult }> {
  const handed: string[] = [];
  const result = await store.claim(box, options, async (batch) => {
    handed.push(...idsOf(batch));
    return batch.records.map(outcome);
  });
  return { handed, result };
}

/** The stored records, by id, in the order asked (fails on an absent one). */
export async function getAll(
  store: OutboxStore,
  box: BoxName,
  ids: readonly string[],
): Promise<StoredRecord[]> {
  const found = await Promise.all(ids.map((id) => store.get(box, id)));
  return found.map((each, index) => {
    if (!each) throw new Error(`record ${ids[index]} is not in ${box}`);
    return each;
  });
}

export interface Deferred<T> {
  readonly promise: Promise<T>;
  resolve(value: T): void;
}

/** A promise settled from outside: holds a claim open while the test does something else. */
export function deferred<T = void>(): Deferred<T> {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((settle) => (resolve = settle));
  return { promise, resolve };
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Polls `check` until it holds (rather than sleeping a fixed time). Local rather than the test
 * app's, so that a store suite does not load Nest and the whole library.
 */
export async function eventually(
  check: () => boolean | Promise<boolean>,
  what: string,
  timeoutMs = 2_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(5);
  }
}

/** `from`..`to`, inclusive. */
export function range(from: number, to: number): number[] {
  return Array.from({ length: Math.max(0, to - from + 1) }, (_, index) => from + index);
}
