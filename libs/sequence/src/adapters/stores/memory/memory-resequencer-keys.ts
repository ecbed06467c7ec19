import type { ResequencerKey } from '../../../ports/resequencer-store.port';
import { assertTime } from '../../../ports/resequencer-store.arguments';
import type { ResequencerKeyRecord } from './memory-resequencer-record';

/**
 * The keys of one scope, and how many events and bytes they buffer (what `maxBufferedTotal` and
 * `maxBufferedBytesTotal` bound).
 */
interface ScopeState {
  /** In order of last write: the head is what expires first. */
  readonly keys: Map<string, ResequencerKeyRecord>;
  /**
   * The retired keys (see {@link MemoryResequencerKeys.retire}), in order of retirement: the head
   * expires first, as long as the scope's keys are retired for one time (stream mode's are).
   */
  readonly retired: Map<string, ResequencerKeyRecord>;
  buffered: number;
  bufferedBytes: number;
}

/** Expired keys dropped from the head of a scope on each write, so that no sweep is needed. */
const PRUNE_PER_WRITE = 8;

/**
 * Where the memory resequencer store keeps its key records: by scope, each scope with its
 * buffered total, every record expiring `retentionMs` after its last write, or sooner once
 * retired. Time is the latest `now` any caller passed (the store has no clock of its own):
 * records expire lazily when looked up, a few at a time from the head of a scope (and of its
 * retired keys) on every write, and all at once when a scope is scanned.
 */
export class MemoryResequencerKeys {
  private readonly scopes = new Map<string, ScopeState>();
  /** The latest `now` seen: what calls that pass no time judge expiry by. */
  private clock = Number.NEGATIVE_INFINITY;

  constructor(private readonly retentionMs: number) {}

  /** The key's record, unless it expired by `now` (or by a later time seen already). */
  find(key: ResequencerKey, now?: number): ResequencerKeyRecord | undefined {
    if (now !== undefined) {
      assertTime('now', now);
      this.clock = Math.max(this.clock, now);
    }
    const scope = this.scopes.get(key.scope);
    const record = scope?.keys.get(key.key);
    if (!scope || !record || !this.isExpired(record)) return record;
    this.drop(key.scope, scope, key.key, record);
    return undefined;
  }

  /** Takes `now` as the time if it is later than any seen (a read that passes its time). */
  advance(now: number): void {
    assertTime('now', now);
    this.clock = Math.max(this.clock, now);
  }

  /**
   * Records a write of `record` (stored under `key` if it is new): `buffered` more events in
   * its buffer (negative when released) and `bufferedBytes` more bytes, its retention restarted,
   * it moved to the tail of its scope (the last to expire), and a few expired keys pruned.
   */
  wrote(
    key: ResequencerKey,
    record: ResequencerKeyRecord,
    now: number,
    buffered: number,
    bufferedBytes = 0,
  ): void {
    let scope = this.scopes.get(key.scope);
    if (!scope) {
      scope = { keys: new Map(), retired: new Map(), buffered: 0, bufferedBytes: 0 };
      this.scopes.set(key.scope, scope);
    }
    record.lastWriteAt = now;
    // A change: the key is no longer retired.
    if (record.retiredUntil !== undefined) {
      record.retiredUntil = undefined;
      scope.retired.delete(key.key);
    }
    scope.keys.delete(key.key);
    scope.keys.set(key.key, record);
    scope.buffered += buffered;
    scope.bufferedBytes += bufferedBytes;
    this.pruneHead(key.scope);
  }

  /**
   * Retires a stored key (see `ResequencerStore.retire`): it expires at `until`, unless that is
   * after its ordinary expiry or a write comes first; a few expired keys are pruned.
   */
  retire(key: ResequencerKey, record: ResequencerKeyRecord, until: number): void {
    const scope = this.scopes.get(key.scope);
    if (!scope) return;
    record.retiredUntil = Math.min(until, record.retiredUntil ?? until);
    scope.retired.delete(key.key);
    scope.retired.set(key.key, record);
    this.pruneHead(key.scope);
  }

  /**
   * Events buffered in the scope. Expired keys are pruned first when the total reaches
   * `atLeast` (by default always), so that abandoned keys never refuse an event.
   */
  bufferedIn(scope: string, atLeast = 0): number {
    if ((this.scopes.get(scope)?.buffered ?? 0) >= atLeast) this.pruneAll(scope);
    return this.scopes.get(scope)?.buffered ?? 0;
  }

  /** Bytes of the events buffered in the scope; prunes as {@link bufferedIn} does. */
  bufferedBytesIn(scope: string, atLeast = 0): number {
    if ((this.scopes.get(scope)?.bufferedBytes ?? 0) >= atLeast) this.pruneAll(scope);
    return this.scopes.get(scope)?.bufferedBytes ?? 0;
  }

  /** The scope's live records, by key (a view: do not keep it across calls). */
  live(scope: string): ReadonlyMap<string, ResequencerKeyRecord> {
    this.pruneAll(scope);
    return this.scopes.get(scope)?.keys ?? new Map<string, ResequencerKeyRecord>();
  }

  /**
   * The scope's live records in the last tenth of their retention at `now` (no write for nine
   * tenths of it), least recently written first.
   */
  expiring(scope: string, now: number): Array<[string, ResequencerKeyRecord]> {
    this.advance(now);
    const idleSince = now - this.retentionMs + Math.floor(this.retentionMs / 10);
    return [...this.live(scope)].filter(([, record]) => record.lastWriteAt <= idleSince);
  }

  clear(): void {
    this.scopes.clear();
  }

  /**
   * Drops expired keys from the head of the scope (the least recently written) and from the head
   * of its retired keys: at most a few of each, stopping at the first live one. Callers' clocks
   * may disagree a little, so a key behind a head may expire first: the next lookup or scan of
   * it drops it.
   */
  private pruneHead(scopeName: string): void {
    const scope = this.scopes.get(scopeName);
    if (!scope) return;
    // Most scopes have no retired keys: no iterator for them on every write.
    if (scope.retired.size > 0) this.pruneQueue(scopeName, scope, scope.retired);
    this.pruneQueue(scopeName, scope, scope.keys);
  }

  private pruneQueue(
    scopeName: string,
    scope: ScopeState,
    queue: Map<string, ResequencerKeyRecord>,
  ): void {
    let budget = PRUNE_PER_WRITE;
    for (const [key, record] of queue) {
      if (budget-- <= 0 || !this.isExpired(record)) break;
      this.drop(scopeName, scope, key, record);
    }
  }

  private pruneAll(scopeName: string): void {
    const scope = this.scopes.get(scopeName);
    if (!scope) return;
    for (const [key, record] of scope.keys) {
      if (this.isExpired(record)) this.drop(scopeName, scope, key, record);
    }
  }

  private drop(scopeName: string, scope: ScopeState, key: string, record: ResequencerKeyRecord) {
    scope.keys.delete(key);
    scope.retired.delete(key);
    scope.buffered -= record.buffer.size;
    scope.bufferedBytes -= record.bufferBytes;
    if (scope.keys.size === 0) this.scopes.delete(scopeName);
  }

  private isExpired(record: ResequencerKeyRecord): boolean {
    const until = Math.min(
      record.lastWriteAt + this.retentionMs,
      record.retiredUntil ?? Number.POSITIVE_INFINITY,
    );
    return until <= this.clock;
  }
}
