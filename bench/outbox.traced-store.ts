/**
 * An OutboxStore that times the relay's claims, for the Outbox benchmark's "where the relay spends
 * its time". It forwards every call unchanged to the PostgresOutboxStore inside (same arguments,
 * same results, the store's own transactions) and reads the clock a few times per claim of
 * `outbox_events` (the other boxes' relays and processors claim as well, and are not counted):
 * - lock: from `claim()` to the handler's start (a pool connection, BEGIN, the SELECT ... FOR
 *   UPDATE SKIP LOCKED of the batch, and turning the rows into records);
 * - publish: the handler (the relay publishing the batch and waiting for the confirms);
 * - settle: from the handler's end to `claim()` resolving (the UPDATE of the outcomes, COMMIT);
 * - between: wall time of the measured window in none of those (the loop, waiting for wake-ups,
 *   and for the relay-only path the app's start).
 */
import type {
  BoxName,
  BoxStats,
  ClaimedBatch,
  ClaimOptions,
  ClaimResult,
  NewBoxRecord,
  PurgeOptions,
  RecordOutcome,
  SqlExecutor,
  StoredRecord,
  StoreTransaction,
} from 'nest-sequence/ports';
import type { OutboxStore } from 'nest-sequence';
import { round1 } from './harness/report';
import { nowMs } from './outbox.settings';

interface Totals {
  claims: number;
  emptyClaims: number;
  records: number;
  lockMs: number;
  publishMs: number;
  settleMs: number;
}

/** Per-claim milliseconds of each phase (claims that locked something), for percentiles. */
interface Samples {
  lock: number[];
  publish: number[];
  settle: number[];
}

/** When a record's claim started (`claim()` called) and when it had its batch locked. */
export interface ClaimTimes {
  readonly startedAt: number;
  readonly lockedAt: number;
}

const p99 = (values: number[]): number | undefined => {
  if (values.length === 0) return undefined;
  const sorted = [...values].sort((a, b) => a - b);
  return round1(sorted[Math.min(sorted.length - 1, Math.ceil(0.99 * sorted.length) - 1)]);
};

const zero = (): Totals => ({
  claims: 0,
  emptyClaims: 0,
  records: 0,
  lockMs: 0,
  publishMs: 0,
  settleMs: 0,
});

export class TracedOutboxStore implements OutboxStore {
  readonly dialect: OutboxStore['dialect'];
  readonly name: string;
  private totals = zero();
  private samples: Samples = { lock: [], publish: [], settle: [] };
  private windowStart = nowMs();
  /** Per record id, when its claim started and when that claim had its batch (latency runs). */
  private claimTimes: Map<string, ClaimTimes> | undefined;

  /** The inner store's, when it has it: writers then take the same path as without the wrapper. */
  readonly appendAtCommit?: OutboxStore['appendAtCommit'];

  constructor(private readonly inner: OutboxStore) {
    this.dialect = inner.dialect;
    this.name = inner.name;
    if (inner.appendAtCommit) {
      this.appendAtCommit = (box, records, within) => inner.appendAtCommit!(box, records, within);
    }
  }

  /** Starts a new measured window. */
  reset(): void {
    this.totals = zero();
    this.samples = { lock: [], publish: [], settle: [] };
    this.windowStart = nowMs();
  }

  /** From now on, notes when each record's claim started and locked (see `claimTimesOf`). */
  trackRecords(): void {
    this.claimTimes = new Map();
  }

  /** When the claim that took record `id` started and had its batch, if it was tracked. */
  claimTimesOf(id: string): ClaimTimes | undefined {
    return this.claimTimes?.get(id);
  }

  /** The claims since `reset()`: counts, and milliseconds per phase (totals and per claim). */
  summary() {
    const t = this.totals;
    const wall = nowMs() - this.windowStart;
    const busy = t.lockMs + t.publishMs + t.settleMs;
    const per = (ms: number) => (t.claims > 0 ? round1(ms / t.claims) : undefined);
    return {
      claims: t.claims,
      emptyClaims: t.emptyClaims,
      meanBatch: t.claims > t.emptyClaims ? round1(t.records / (t.claims - t.emptyClaims)) : 0,
      totalMs: {
        lock: Math.round(t.lockMs),
        publish: Math.round(t.publishMs),
        settle: Math.round(t.settleMs),
        between: Math.round(Math.max(0, wall - busy)),
      },
      perClaimMs: { lock: per(t.lockMs), publish: per(t.publishMs), settle: per(t.settleMs) },
      p99PerClaimMs: {
        lock: p99(this.samples.lock),
        publish: p99(this.samples.publish),
        settle: p99(this.samples.settle),
      },
    };
  }

  async claim(
    box: BoxName,
    options: ClaimOptions,
    handle: (batch: ClaimedBatch) => Promise<readonly RecordOutcome[]>,
  ): Promise<ClaimResult> {
    if (box !== 'outbox_events') return this.inner.claim(box, options, handle);
    const started = nowMs();
    let handleStart: number | undefined;
    let handleEnd: number | undefined;
    const result = await this.inner.claim(box, options, async (batch) => {
      handleStart = nowMs();
      if (this.claimTimes) {
        for (const record of batch.records) {
          this.claimTimes.set(record.id, { startedAt: started, lockedAt: handleStart });
        }
      }
      try {
        return await handle(batch);
      } finally {
        handleEnd = nowMs();
      }
    });
    const ended = nowMs();
    this.totals.claims += 1;
    this.totals.records += result.claimed;
    if (handleStart === undefined || handleEnd === undefined) {
      this.totals.emptyClaims += 1;
      this.totals.lockMs += ended - started;
    } else {
      this.totals.lockMs += handleStart - started;
      this.totals.publishMs += handleEnd - handleStart;
      this.totals.settleMs += ended - handleEnd;
      this.samples.lock.push(handleStart - started);
      this.samples.publish.push(handleEnd - handleStart);
      this.samples.settle.push(ended - handleEnd);
    }
    return result;
  }

  migrate(): Promise<void> {
    return this.inner.migrate();
  }

  transaction<T>(work: (transaction: StoreTransaction) => Promise<T>): Promise<T> {
    return this.inner.transaction(work);
  }

  append(
    box: BoxName,
    records: readonly NewBoxRecord[],
    within: StoreTransaction | SqlExecutor,
  ): Promise<string[]> {
    return this.inner.append(box, records, within);
  }

  lockPartitions(
    box: BoxName,
    keys: readonly string[],
    within: StoreTransaction | SqlExecutor,
  ): Promise<void> {
    return this.inner.lockPartitions?.(box, keys, within) ?? Promise.resolve();
  }

  receive(box: BoxName, record: NewBoxRecord): Promise<'added' | 'duplicate'> {
    return this.inner.receive(box, record);
  }

  get(box: BoxName, id: string): Promise<StoredRecord | undefined> {
    return this.inner.get(box, id);
  }

  listFailed(box: BoxName, limit: number): Promise<StoredRecord[]> {
    return this.inner.listFailed(box, limit);
  }

  retry(box: BoxName, ids: readonly string[], now: number): Promise<number> {
    return this.inner.retry(box, ids, now);
  }

  purge(box: BoxName, options: PurgeOptions): Promise<number> {
    return this.inner.purge(box, options);
  }

  stats(box: BoxName): Promise<BoxStats> {
    return this.inner.stats(box);
  }

  watch(listener: (box: BoxName) => void): Promise<() => Promise<void>> {
    return this.inner.watch(listener);
  }

  ping(): Promise<void> {
    return this.inner.ping();
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}
