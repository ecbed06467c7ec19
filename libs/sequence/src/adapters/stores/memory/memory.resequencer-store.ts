import { checkOptionKeys, type OptionKeysOf } from '../../../core/option-keys';
import {
  assertResequencerArguments,
  CLOSED_KEY_NEXT,
  heldEntryBytes,
  type AcceptContext,
  type AcceptOutcome,
  type DrainClaim,
  type DrainContext,
  type DrainSettlement,
  type ExpiringGap,
  type GapPolicy,
  type GapResolution,
  type GapResolveContext,
  type GapStats,
  type HandOffItem,
  type OpenGap,
  type ResequencedEntry,
  type ResequencerKey,
  type ResequencerKeyState,
  type ResequencerLimits,
  type ResequencerStore,
} from '../../../ports/resequencer-store.port';
import {
  assertLimits,
  assertDrainArguments,
  assertGapPolicy,
  assertHolder,
  assertPositiveInteger,
  assertScope,
  assertStart,
  assertTime,
} from '../../../ports/resequencer-store.arguments';
import { MemoryResequencerKeys } from './memory-resequencer-keys';
import { BodyCipher, type StoreEncryptionOptions } from '../../../core/body-cipher';
import { SealedBufferFailure } from '../../../core/sealed-buffer';
import { openEntry, sealEntry, undecryptableItem } from '../sealed-entry';
import {
  applyPolicy,
  bufferedSeqs,
  bufferEntry,
  head,
  lowestBuffered,
  newKeyRecord,
  releaseRun,
  reopenGap,
  settleHandOff,
  type HeldEntry,
  type ResequencerKeyRecord,
} from './memory-resequencer-record';
import { checkInteger } from '../../../core/option-checks';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

export interface MemoryResequencerStoreOptions {
  /**
   * How long a key's state is kept after its last write; a key accepted again after that
   * starts from `start`. Bounds the memory of abandoned keys.
   * @default 604_800_000 (7 days)
   */
  readonly retentionMs?: number;
  /**
   * Keeps every event's body and headers AES-256-GCM encrypted in memory, bound to its key and
   * sequence (see docs/security.md); the byte bounds count the plaintext. @default none
   */
  readonly encryption?: StoreEncryptionOptions;
}

const MEMORY_RESEQUENCER_STORE_KEYS = {
  retentionMs: true,
  encryption: true,
} as const satisfies OptionKeysOf<MemoryResequencerStoreOptions>;

/**
 * The default {@link ResequencerStore}: state in this process's memory, shared by every
 * resequencer of the process (another process does not see it, and it is lost on restart).
 *
 * Every method runs synchronously to its end once called, so each is one atomic step. Records
 * expire `retentionMs` after their last write (a retired one at its retirement's end, if
 * sooner), judged against the latest `now` any caller passed: lazily when touched, a few at a
 * time on every write and retirement, and in the scans of `listGaps`, `gapStats`,
 * `listStalledHandOffs` and `bufferedTotal`.
 */
export class MemoryResequencerStore implements ResequencerStore {
  readonly name = 'memory';

  private readonly keys: MemoryResequencerKeys;
  private readonly cipher?: BodyCipher;

  /** @throws SequenceOptionsError when an encryption key is missing, malformed or not 32 bytes. */
  constructor(options: MemoryResequencerStoreOptions = {}) {
    const retentionMs = options.retentionMs ?? 604_800_000;
    const problems: string[] = [];
    checkOptionKeys(problems, options, MEMORY_RESEQUENCER_STORE_KEYS);
    checkInteger(problems, 'retentionMs', retentionMs, 1);
    if (problems.length > 0) {
      throw new SequenceOptionsError('MemoryResequencerStore options', problems);
    }
    this.keys = new MemoryResequencerKeys(retentionMs);
    if (options.encryption !== undefined) {
      this.cipher = new BodyCipher(options.encryption, 'MemoryResequencerStore encryption');
    }
  }

  async accept(
    key: ResequencerKey,
    entry: ResequencedEntry,
    context: AcceptContext,
  ): Promise<AcceptOutcome> {
    assertResequencerArguments(key, entry.seq);
    assertStart(context.start);
    assertLimits(context.limits);
    const { now, limits } = context;
    const existing = this.keys.find(key, now);
    const next = lateNext(existing, entry.seq) ?? existing?.next ?? context.start;
    if (entry.seq < next) {
      const pending = (existing?.handOff.length ?? 0) > 0;
      if (!pending || !context.drain) return { kind: 'late', next, pending };
      return { kind: 'late', next, pending, drain: await this.claimDrain(key, drainAt(context)) };
    }
    if (existing?.buffer.has(entry.seq)) return { kind: 'duplicate', next };
    if (limits.maxSeqAhead !== undefined && entry.seq - next > limits.maxSeqAhead) {
      return { kind: 'full', next, limit: 'maxSeqAhead' };
    }
    const bytes = heldEntryBytes(entry);
    // The event that fills the gap is refused only while a drain will make room for it.
    const refused =
      entry.seq > next || (existing?.handOff.length ?? 0) > 0
        ? keyRefusal(existing, bytes, limits)
        : undefined;
    if (refused) return { kind: 'full', next, limit: refused };
    if (entry.seq > next) {
      if (this.keys.bufferedIn(key.scope, limits.maxBufferedTotal) >= limits.maxBufferedTotal) {
        return { kind: 'full', next, limit: 'maxBufferedTotal' };
      }
      const maxBytes = limits.maxBufferedBytesTotal;
      if (
        maxBytes !== undefined &&
        this.keys.bufferedBytesIn(key.scope, maxBytes - bytes + 1) + bytes > maxBytes
      ) {
        return { kind: 'full', next, limit: 'maxBufferedBytesTotal' };
      }
    }

    const record = existing ?? newKeyRecord(context.start, now);
    const wasEmpty = record.buffer.size === 0;
    const bufferBytesBefore = record.bufferBytes;
    bufferEntry(record, this.held(key, entry, bytes));
    if (entry.seq === next) {
      const count = releaseRun(record, now);
      this.keys.wrote(key, record, now, 1 - count, record.bufferBytes - bufferBytesBefore);
      if (!context.drain) return { kind: 'released', next: record.next, count };
      const drain = await this.claimDrain(key, drainAt(context));
      return { kind: 'released', next: record.next, count, drain };
    }
    if (wasEmpty) reopenGap(record, now);
    this.keys.wrote(key, record, now, 1, bytes);
    return { kind: 'buffered', next, buffered: record.buffer.size };
  }

  async claimDrain(key: ResequencerKey, context: DrainContext): Promise<DrainClaim> {
    assertDrainArguments(key, context);
    const { holder, now } = context;
    const record = this.keys.find(key, now);
    if (!record || record.handOff.length === 0) {
      if (record?.lease?.holder === holder) {
        record.lease = undefined;
        this.keys.wrote(key, record, now, 0);
      }
      return { kind: 'empty' };
    }
    const { lease } = record;
    if (lease && lease.holder !== holder && lease.until > now) return { kind: 'busy' };
    record.lease = { holder, until: now + context.leaseMs };
    this.keys.wrote(key, record, now, 0);
    return { kind: 'claimed', items: this.opened(key, head(record, context.limit)) };
  }

  async settleDrain(
    key: ResequencerKey,
    count: number,
    context: DrainContext,
  ): Promise<DrainSettlement> {
    assertDrainArguments(key, context);
    assertPositiveInteger('count', count);
    const { now } = context;
    const record = this.keys.find(key, now);
    // An expired lease nobody took over is still the caller's: only a new holder ends it.
    if (!record?.lease || record.lease.holder !== context.holder) return { kind: 'lost' };
    settleHandOff(record, count);
    this.keys.wrote(key, record, now, 0);
    if (record.handOff.length === 0) {
      record.lease = undefined;
      record.handOffAt = undefined;
      record.tracked = false;
      return { kind: 'empty' };
    }
    record.handOffAt = now;
    record.lease.until = now + context.leaseMs;
    return { kind: 'claimed', items: this.opened(key, head(record, context.limit)) };
  }

  async renewDrain(
    key: ResequencerKey,
    holder: string,
    leaseMs: number,
    now: number,
  ): Promise<boolean> {
    assertResequencerArguments(key);
    assertHolder(holder);
    assertPositiveInteger('leaseMs', leaseMs);
    assertTime('now', now);
    const lease = this.keys.find(key)?.lease;
    if (lease?.holder !== holder) return false;
    lease.until = now + leaseMs;
    return true;
  }

  async releaseDrain(key: ResequencerKey, holder: string): Promise<void> {
    assertResequencerArguments(key);
    assertHolder(holder);
    const record = this.keys.find(key);
    if (record?.lease?.holder === holder) record.lease = undefined;
  }

  async listGaps(
    scope: string,
    openedBefore: number,
    limit: number,
    includeAlerted = false,
  ): Promise<OpenGap[]> {
    assertScope(scope);
    assertTime('openedBefore', openedBefore);
    assertPositiveInteger('limit', limit);
    return [...this.keys.live(scope)]
      .filter(
        ([, record]) =>
          record.gapSince !== undefined &&
          (includeAlerted || !record.alerted) &&
          record.gapSince <= openedBefore,
      )
      .sort(byTimeThenKey((record) => record.gapSince!))
      .slice(0, limit)
      .map(([key, record]) => openGap(key, record));
  }

  async listExpiringGaps(scope: string, now: number, limit: number): Promise<ExpiringGap[]> {
    assertScope(scope);
    assertTime('now', now);
    assertPositiveInteger('limit', limit);
    return this.keys
      .expiring(scope, now)
      .filter(([, record]) => record.gapSince !== undefined)
      .sort(byTimeThenKey((record) => record.lastWriteAt))
      .slice(0, limit)
      .map(([key, record]) => ({ ...openGap(key, record), changedAt: record.lastWriteAt }));
  }

  async gapStats(scope: string, now: number): Promise<GapStats> {
    assertScope(scope);
    this.keys.advance(now);
    // One pass over the scope's keys, in this process: no index to keep for a read that a
    // scrape makes every few seconds.
    let openGaps = 0;
    let oldest = Number.POSITIVE_INFINITY;
    for (const record of this.keys.live(scope).values()) {
      if (record.gapSince === undefined) continue;
      openGaps++;
      oldest = Math.min(oldest, record.gapSince);
    }
    return openGaps === 0 ? { openGaps } : { openGaps, oldestGapAgeMs: Math.max(0, now - oldest) };
  }

  async resolveGap(
    key: ResequencerKey,
    policy: GapPolicy,
    context: GapResolveContext,
  ): Promise<GapResolution> {
    assertResequencerArguments(key);
    assertGapPolicy(policy);
    assertTime('openedBefore', context.openedBefore);
    const { now, unchangedSince } = context;
    if (unchangedSince !== undefined) assertTime('unchangedSince', unchangedSince);
    const record = this.keys.find(key, now);
    if (
      record?.gapSince === undefined ||
      record.gapSince > context.openedBefore ||
      (unchangedSince !== undefined && record.lastWriteAt > unchangedSince)
    ) {
      return { kind: 'none' };
    }
    const before = record.buffer.size;
    const bytesBefore = record.bufferBytes;
    const missing = record.next;
    const gapSince = record.gapSince;
    const appended = applyPolicy(record, policy, now);
    if (appended > 0 && policy === 'dead-letter' && context.close) {
      record.closedFrom = missing;
      record.next = CLOSED_KEY_NEXT;
    }
    if (appended > 0) record.tracked = true;
    if (appended === 0) return { kind: 'none' };
    this.keys.wrote(
      key,
      record,
      now,
      record.buffer.size - before,
      record.bufferBytes - bytesBefore,
    );
    if (policy !== 'skip') return { kind: 'resolved', policy, appended };
    // The gap-skipped item it appended first, ahead of the run it released.
    const item = record.handOff[record.handOff.length - appended] as Extract<
      HandOffItem,
      { kind: 'gap-skipped' }
    >;
    const skipped = { from: item.from, to: item.to, gapSince };
    return { kind: 'resolved', policy, appended, skipped };
  }

  async listStalledHandOffs(scope: string, idleSince: number, limit: number): Promise<string[]> {
    assertScope(scope);
    assertTime('idleSince', idleSince);
    assertPositiveInteger('limit', limit);
    return [...this.keys.live(scope)]
      .filter(
        ([, record]) =>
          record.tracked === true &&
          record.handOffAt !== undefined &&
          record.handOffAt <= idleSince,
      )
      .sort(byTimeThenKey((record) => record.handOffAt!))
      .slice(0, limit)
      .map(([key]) => key);
  }

  async retire(key: ResequencerKey, retainMs: number, now: number): Promise<boolean> {
    assertResequencerArguments(key);
    assertPositiveInteger('retainMs', retainMs);
    const record = this.keys.find(key, now);
    if (!record || record.buffer.size > 0 || record.handOff.length > 0) return false;
    this.keys.retire(key, record, now + retainMs);
    return true;
  }

  async inspect(key: ResequencerKey, start: number): Promise<ResequencerKeyState> {
    assertResequencerArguments(key);
    assertStart(start);
    const record = this.keys.find(key);
    if (!record) return { next: start, buffered: [], handOff: 0 };
    const heldBytes = record.bufferBytes + record.handOffBytes;
    return {
      next: record.next,
      buffered: bufferedSeqs(record),
      handOff: record.handOff.length,
      ...(record.gapSince === undefined ? {} : { gapSince: record.gapSince }),
      ...(heldBytes === 0 ? {} : { heldBytes }),
    };
  }

  async bufferedTotal(scope: string): Promise<number> {
    assertScope(scope);
    return this.keys.bufferedIn(scope);
  }

  async bufferedBytes(scope: string): Promise<number> {
    assertScope(scope);
    return this.keys.bufferedBytesIn(scope);
  }

  /** The entry as held: sealed when the store encrypts (bounds still count `bytes`). */
  private held(key: ResequencerKey, entry: ResequencedEntry, bytes: number): HeldEntry {
    if (!this.cipher) return entry;
    return {
      seq: entry.seq,
      body: sealEntry(this.cipher, key, entry),
      headers: {},
      heldBytes: bytes,
    };
  }

  /** Items as handed out: sealed entries opened; one that does not open is `undecryptable`. */
  private opened(key: ResequencerKey, items: HandOffItem[]): HandOffItem[] {
    const cipher = this.cipher;
    if (!cipher) return items;
    return items.map((item) => {
      if (item.kind !== 'event' && item.kind !== 'dead-letter') return item;
      const entry = openEntry(cipher, key, item.entry.seq, item.entry.body);
      if (entry instanceof SealedBufferFailure) {
        return undecryptableItem(key, item.entry.seq, entry);
      }
      return { ...item, entry };
    });
  }

  async ping(): Promise<void> {}

  /** Forgets every key (the state lives only as long as this process uses it). */
  async close(): Promise<void> {
    this.keys.clear();
  }
}

/**
 * A closed key's answer to an event released before it closed (a repeat): the sequence that went
 * missing, so that the event is an ordinary late one rather than one the close refuses.
 */
function lateNext(record: ResequencerKeyRecord | undefined, seq: number): number | undefined {
  const closedFrom = record?.closedFrom;
  return closedFrom !== undefined && seq < closedFrom ? closedFrom : undefined;
}

/** A key waiting on a gap, as the listings report it. */
function openGap(key: string, record: ResequencerKeyRecord): OpenGap {
  return {
    key,
    expected: record.next,
    buffered: record.buffer.size,
    lowest: lowestBuffered(record),
    gapSince: record.gapSince!,
    alerted: record.alerted,
  };
}

/** Oldest first; keys break ties, so that listings are stable. */
function byTimeThenKey(time: (record: ResequencerKeyRecord) => number) {
  return (
    [keyA, a]: [string, ResequencerKeyRecord],
    [keyB, b]: [string, ResequencerKeyRecord],
  ): number => time(a) - time(b) || (keyA < keyB ? -1 : keyA > keyB ? 1 : 0);
}

/** The per-key bound taking an event of `bytes` more would pass, if any. */
function keyRefusal(
  record: ResequencerKeyRecord | undefined,
  bytes: number,
  limits: ResequencerLimits,
): 'maxBufferedPerKey' | 'maxBufferedBytesPerKey' | undefined {
  // A key without a record holds nothing: its first event is measured against the budgets too.
  const held = record ? record.buffer.size + record.handOff.length : 0;
  if (held >= limits.maxBufferedPerKey) return 'maxBufferedPerKey';
  const maxBytes = limits.maxBufferedBytesPerKey;
  const heldBytes = record ? record.bufferBytes + record.handOffBytes : 0;
  if (maxBytes !== undefined && heldBytes + bytes > maxBytes) return 'maxBufferedBytesPerKey';
  return undefined;
}

/** The drain context an accept that also claims the lease uses. */
function drainAt(context: AcceptContext): DrainContext {
  return { ...context.drain!, now: context.now };
}
