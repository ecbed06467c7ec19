import type { HeaderValue } from '../core/headers';
import { hasLoneSurrogate } from '../core/unicode';

/** One resequencer key: `scope` names the resequencer (its channel), `key` the ordered stream. */
export interface ResequencerKey {
  /** The resequencer: keys of different scopes never share state. Any non-empty string. */
  readonly scope: string;
  /** The key (a transfer id, an order id): 1–256 characters, no control characters. */
  readonly key: string;
}

/** An event as the store keeps it: opaque bytes plus the headers it arrived with. */
export interface ResequencedEntry {
  /** Its sequence number: a safe integer >= 0. */
  readonly seq: number;
  readonly body: Buffer;
  readonly headers: Readonly<Record<string, HeaderValue>>;
}

/**
 * The per-key and store-wide bounds `accept` checks before it takes an event. A key holds the
 * events of its buffer and the items of its hand-off list: the per-key bounds count both (a
 * drain that is held up cannot let the list grow), the scope-wide ones the buffers only (a
 * hand-off list is bounded per key and drains without waiting for anything). Bytes are counted
 * per event by `heldEntryBytes` (body, headers, 64 bytes); gap records in a hand-off list count
 * as items, with no bytes. An absent byte bound is no bound.
 */
export interface ResequencerLimits {
  /** Most events and hand-off items held for one key. */
  readonly maxBufferedPerKey: number;
  /** Most events buffered for the whole scope (the store may check it against a total a few ms old). */
  readonly maxBufferedTotal: number;
  /** Most bytes of events held for one key (buffer and hand-off list). */
  readonly maxBufferedBytesPerKey?: number;
  /** Most bytes of events buffered for the whole scope (checked as `maxBufferedTotal` is). */
  readonly maxBufferedBytesTotal?: number;
  /**
   * Furthest an event to be buffered may be ahead of the key's next expected sequence: one whose
   * `seq` is more than `next + maxSeqAhead` is refused (`full`), so that a sequence number far in
   * the future (a producer's bug) cannot sit in the buffer until a gap policy moves `next` past
   * it and every later event of the key is late. Absent: no bound.
   */
  readonly maxSeqAhead?: number;
}

/**
 * What every held event costs on top of its body and headers: a store keeps a record, an index
 * entry and a list or set node per event, so that even empty events fill a budget.
 */
export const HELD_ENTRY_OVERHEAD_BYTES = 64;

/**
 * The bytes an event counts for against the byte bounds: its body, the UTF-8 bytes of its
 * headers' names and values (as text), and {@link HELD_ENTRY_OVERHEAD_BYTES}.
 */
export function heldEntryBytes(entry: ResequencedEntry): number {
  let bytes = entry.body.length + HELD_ENTRY_OVERHEAD_BYTES;
  for (const [name, value] of Object.entries(entry.headers)) {
    bytes += Buffer.byteLength(name) + Buffer.byteLength(String(value));
  }
  return bytes;
}

export interface AcceptContext {
  /** The key's first sequence number, used while the key has no state. */
  readonly start: number;
  readonly limits: ResequencerLimits;
  readonly now: number;
  /**
   * When set, an event `released` (or `late` with `pending`) also claims the drain lease for
   * `holder` in the same atomic step, as `claimDrain` would at `now`: the outcome's `drain` says
   * how (one round trip fewer for the usual case, where the releasing instance drains).
   */
  readonly drain?: Omit<DrainContext, 'now'>;
}

/**
 * What `accept` did with an event:
 * - `released`: it was the next expected: it and the contiguous run after it from the buffer
 *   (`count` events in all) went to the hand-off list, and `next` advanced past them;
 * - `buffered`: it is ahead of `next`: kept until the gap before it fills (`buffered` is the
 *   key's buffer size now);
 * - `duplicate`: the same sequence is already buffered: dropped;
 * - `late`: the sequence is below `next`: a late event or a duplicate of one released already:
 *   dropped. `pending` is true while the key's hand-off list is not empty (the event may not be
 *   delivered yet): whoever holds its input message should drain before acking;
 * - `full`: taking it would pass `limit`: nothing stored.
 */
export type AcceptOutcome =
  | {
      readonly kind: 'released';
      readonly next: number;
      readonly count: number;
      /** The drain claim, when `context.drain` asked for one. */
      readonly drain?: DrainClaim;
    }
  | { readonly kind: 'buffered'; readonly next: number; readonly buffered: number }
  | { readonly kind: 'duplicate'; readonly next: number }
  | {
      readonly kind: 'late';
      readonly next: number;
      readonly pending: boolean;
      /** The drain claim, when `context.drain` asked for one and `pending` is true. */
      readonly drain?: DrainClaim;
    }
  | {
      readonly kind: 'full';
      readonly next: number;
      readonly limit: keyof ResequencerLimits;
    };

/**
 * An item of a key's hand-off list, in the order it must be delivered:
 * - `event`: released in sequence: deliver it (handler, output channel);
 * - `dead-letter`: a buffered event moved out by the `'dead-letter'` gap policy;
 * - `gap-alert`: the gap before `expected` stayed open past the timeout (`'alert'` policy);
 * - `gap-skipped`: the sequences `from`..`to` were given up (`'skip'` policy);
 * - `undecryptable`: an event a store keeps encrypted did not decrypt (altered in the store).
 */
export type HandOffItem =
  | { readonly kind: 'event'; readonly entry: ResequencedEntry }
  | { readonly kind: 'dead-letter'; readonly entry: ResequencedEntry; readonly expected: number }
  | {
      readonly kind: 'gap-alert';
      readonly expected: number;
      readonly buffered: number;
      readonly gapSince: number;
    }
  | { readonly kind: 'gap-skipped'; readonly from: number; readonly to: number }
  | {
      /**
       * A store that encrypts found an event (released or moved out) that does not decrypt:
       * dead-letter it as an integrity failure (`detail` says why), never deliver it.
       */
      readonly kind: 'undecryptable';
      readonly seq: number;
      readonly detail: string;
    };

export interface DrainContext {
  /** Identifies the drainer (unique per drain attempt). */
  readonly holder: string;
  readonly leaseMs: number;
  /** Most items returned at once. */
  readonly limit: number;
  readonly now: number;
}

/**
 * `claimDrain`'s answer: `items` is the head of the hand-off list, now the caller's to deliver
 * under a lease until `now + leaseMs`; `empty` means nothing is waiting (no lease taken);
 * `busy` that another holder's lease is live.
 */
export type DrainClaim =
  | { readonly kind: 'claimed'; readonly items: readonly HandOffItem[] }
  | { readonly kind: 'empty' }
  | { readonly kind: 'busy' };

/**
 * `settleDrain`'s answer: `lost` when the caller no longer held the lease (nothing trimmed);
 * otherwise the next items (the lease renewed) or `empty` (the lease released).
 */
export type DrainSettlement = DrainClaim | { readonly kind: 'lost' };

/** A key whose buffer is waiting for a gap to fill. */
export interface OpenGap {
  readonly key: string;
  /** The sequence the key waits for. */
  readonly expected: number;
  /** Events buffered behind the gap. */
  readonly buffered: number;
  /** The lowest buffered sequence. */
  readonly lowest: number;
  /** When the gap opened (ms): the time the buffer last went from empty to not, or a release left it not empty. */
  readonly gapSince: number;
  /** True once the `'alert'` policy reported it (it is not listed as due again). */
  readonly alerted: boolean;
}

/**
 * An open gap whose key is close to its retention (see `listExpiringGaps`): `changedAt` is the
 * key's last change as the store recorded it, for `resolveGap`'s `unchangedSince`.
 */
export interface ExpiringGap extends OpenGap {
  readonly changedAt: number;
}

export type GapPolicy = 'alert' | 'skip' | 'dead-letter';

/** A scope's open gaps at a glance, as `gapStats` reads them for gauges and health checks. */
export interface GapStats {
  /** Keys of the scope waiting on a gap, alerted or not (every gap `listGaps` can list). */
  readonly openGaps: number;
  /** How long the oldest of them has been open at `now`, in ms (>= 0); absent when none is. */
  readonly oldestGapAgeMs?: number;
}

/** `resolveGap`'s conditions: the gap opened at or before `openedBefore`; the time is `now`. */
export interface GapResolveContext {
  readonly openedBefore: number;
  readonly now: number;
  /**
   * When given, the gap is resolved only if its key has not changed since (its last change, as
   * `ExpiringGap.changedAt` reports it, is at or before this).
   */
  readonly unchangedSince?: number;
  /**
   * With `'dead-letter'`: the key is closed as well: `next` moves to {@link CLOSED_KEY_NEXT},
   * past every sequence, so that every later event of the key is `late`, answered with that
   * `next`; one released before (a repeat, below the sequence that went missing) is answered
   * with the missing sequence as `next`, as a plain late one.
   */
  readonly close?: boolean;
}

/**
 * The gap a `'skip'` resolution gave up, as the key was when it did: the sequences `from`..`to`
 * (its `gap-skipped` item's) and when that gap had opened. A key listed by `listGaps` may have
 * changed before its resolution (an event buffered below the listed `lowest`): this is what the
 * store skipped.
 */
export interface SkippedGap {
  readonly from: number;
  readonly to: number;
  readonly gapSince: number;
}

/**
 * What `resolveGap` did: `none` when the key no longer had a gap opened at or before
 * `openedBefore` (another instance resolved it, or it filled); otherwise the hand-off items it
 * appended (drain them), and with `'skip'` the gap it gave up.
 */
export type GapResolution =
  | { readonly kind: 'none' }
  | {
      readonly kind: 'resolved';
      readonly policy: Exclude<GapPolicy, 'skip'>;
      readonly appended: number;
    }
  | {
      readonly kind: 'resolved';
      readonly policy: 'skip';
      readonly appended: number;
      readonly skipped: SkippedGap;
    };

/** A key's state, for inspection. */
export interface ResequencerKeyState {
  /** The next sequence to release (`start` when the key has no state). */
  readonly next: number;
  /** Buffered sequences, ascending. */
  readonly buffered: readonly number[];
  /** Items in the hand-off list, not yet delivered. */
  readonly handOff: number;
  /** When the current gap opened, if the buffer is not empty. */
  readonly gapSince?: number;
  /** Bytes of the events in the buffer and the hand-off list (`heldEntryBytes`), if any. */
  readonly heldBytes?: number;
}

/**
 * Port: the state of resequencers: per key, the next expected sequence, a buffer of early events
 * (ordered by sequence) and a durable hand-off list of what is ready to deliver, with a drain
 * lease. Shared by every consumer instance; every method is one atomic step per key.
 *
 * Contract, checked by the resequencer-store conformance suite:
 * - `accept` compares the event's sequence to the key's `next` (absent: `context.start`) and
 *   answers per {@link AcceptOutcome}. Releasing and advancing `next` happen in one atomic step:
 *   two instances accepting events of one key never release a sequence twice or out of order.
 *   An event to buffer is refused (`full`) when the key would hold more than
 *   `maxBufferedPerKey` items or `maxBufferedBytesPerKey` bytes, or the scope more than
 *   `maxBufferedTotal` events or `maxBufferedBytesTotal` bytes in its buffers. The event that
 *   fills a gap is refused only for the per-key bounds, and only while the key's hand-off list is
 *   not empty (its drain will make room); with an empty list it is always taken, so a full buffer
 *   can always drain: a key holds at most one event past its bounds.
 * - The hand-off list keeps items in release order until a drainer settles them. `claimDrain`
 *   gives its head to one holder at a time (a lease; an expired lease may be taken over);
 *   `settleDrain(count)` removes the first `count` items only if the caller still holds the
 *   lease, then returns the next batch (lease renewed) or releases the lease when the list is
 *   empty. `renewDrain` extends a lease its holder still has, and never takes one. A drainer that
 *   dies leaves its items in place for the next holder: nothing is lost or reordered (items
 *   delivered but not settled are delivered again: at-least-once).
 * - Gaps: every key with a non-empty buffer is listed by `listGaps` with the time its gap opened,
 *   and counted by `gapStats`, which also tells the oldest one's age.
 *   `resolveGap` applies a policy atomically, only if the key still has a gap opened at or before
 *   `openedBefore` (so instances sweeping at once resolve each gap once):
 *   - `alert`: appends a `gap-alert` item and marks the gap alerted (no longer listed as due
 *     until a new gap opens; listed with `alerted: true` when alerted gaps are asked for); the
 *     buffer stays;
 *   - `skip`: appends `gap-skipped` for `next`..`lowest − 1`, moves `next` to the lowest buffered
 *     sequence and releases the contiguous run from there; answers that range (`skipped`);
 *   - `dead-letter`: appends every buffered event as a `dead-letter` item, empties the buffer and
 *     moves `next` past the highest of them (with `close`, to `CLOSED_KEY_NEXT`: every later
 *     event of the key is late).
 * - Every record expires after `retentionMs` without activity (a change, or a drain claim: a
 *   key whose drainers keep claiming it keeps its hand-off list) (the adapter's option), so
 *   abandoned keys cannot leak memory; a key accepted again after that starts from `start`.
 *   `listExpiringGaps` names the keys holding buffered events in the last tenth of that time, so
 *   that their events are dead-lettered rather than deleted.
 * - `retire` shortens that time for a key that holds nothing and is not expected to get more
 *   (stream mode: a sequence that ended): its record expires `retainMs` after the call, or at its
 *   ordinary expiry if sooner, answering its events `late` until then; a change after it (an
 *   event buffered or released) gives the key the ordinary retention again, from that change.
 */
export interface ResequencerStore {
  /** Short name for logs and health checks (`memory`, `redis`). */
  readonly name: string;
  accept(
    key: ResequencerKey,
    entry: ResequencedEntry,
    context: AcceptContext,
  ): Promise<AcceptOutcome>;
  claimDrain(key: ResequencerKey, context: DrainContext): Promise<DrainClaim>;
  settleDrain(key: ResequencerKey, count: number, context: DrainContext): Promise<DrainSettlement>;
  /**
   * Extends the lease to `now + leaseMs` if `holder` still holds it (expired or not, as long as
   * nobody took it over); true when it did. Never takes a lease: a drainer that lost its lease
   * must stop, not take back a free one over items someone else has settled meanwhile.
   */
  renewDrain(key: ResequencerKey, holder: string, leaseMs: number, now: number): Promise<boolean>;
  /** Lets the lease go early (a drainer that gives up); a no-op unless `holder` holds it. */
  releaseDrain(key: ResequencerKey, holder: string): Promise<void>;
  /**
   * Up to `limit` gaps of `scope` opened at or before `openedBefore`, oldest first: those not
   * alerted yet (what a sweep under `'alert'` resolves); with `includeAlerted`, also those whose
   * alert went out and which still wait (`alerted: true`), that is every open gap (what a sweep
   * under another policy resolves).
   */
  listGaps(
    scope: string,
    openedBefore: number,
    limit: number,
    includeAlerted?: boolean,
  ): Promise<OpenGap[]>;
  resolveGap(
    key: ResequencerKey,
    policy: GapPolicy,
    context: GapResolveContext,
  ): Promise<GapResolution>;
  /**
   * Up to `limit` open gaps of `scope`, alerted or not, whose key has not changed for nine tenths
   * of the store's retention at `now` (and has not expired yet), least recently changed first:
   * what retention would soon delete with the events held behind the gap. The sweeper
   * dead-letters them (`resolveGap` with `'dead-letter'` and `unchangedSince`) instead.
   */
  listExpiringGaps(scope: string, now: number, limit: number): Promise<ExpiringGap[]>;
  /**
   * Up to `limit` keys of `scope` whose hand-off list holds items a gap resolution appended and
   * has not been settled since `idleSince`, oldest first: the sweeper drains them, since no
   * input message covers them (its drainer died). Lists filled by `accept` are not listed: the
   * input message that released them stays unacked until they are delivered, and its
   * redelivery drains them.
   */
  listStalledHandOffs(scope: string, idleSince: number, limit: number): Promise<string[]>;
  /**
   * How many keys of `scope` wait on a gap now, alerted or not, and how long the oldest has
   * waited at `now`. Cheap whatever the number of keys (a gauge reads it at every scrape); keys
   * past their retention are not counted.
   */
  gapStats(scope: string, now: number): Promise<GapStats>;
  /**
   * Lets the key's record expire at `now + retainMs` (or at its ordinary expiry, if that comes
   * first) when its buffer and hand-off list are both empty; true when it did. Until then its
   * `next` still stands (events below it are `late`), and a change of the key (see the contract
   * above) restores the ordinary retention. A key holding anything, or without state, is left as
   * it is (false). A late event, a duplicate or a refused one is no change.
   */
  retire(key: ResequencerKey, retainMs: number, now: number): Promise<boolean>;
  /** A key's state, for inspection. */
  inspect(key: ResequencerKey, start: number): Promise<ResequencerKeyState>;
  /** Events buffered in `scope` now (what `maxBufferedTotal` bounds). */
  bufferedTotal(scope: string): Promise<number>;
  /** Bytes of the events buffered in `scope` now (what `maxBufferedBytesTotal` bounds). */
  bufferedBytes(scope: string): Promise<number>;
  /** Resolves when the store is reachable now; rejects saying why not. */
  ping(): Promise<void>;
  /** Releases the store's resources (a client it created); idempotent. */
  close(): Promise<void>;
}

/** Throws a `RangeError` naming the first argument that breaks the port's rules. */
export function assertResequencerArguments(key: ResequencerKey, seq?: number): void {
  if (typeof key.scope !== 'string' || key.scope.length === 0) {
    throw new RangeError('a resequencer scope must be a non-empty string');
  }
  if (!isResequencerKey(key.key)) {
    throw new RangeError(
      `resequencer key ${JSON.stringify(key.key)} must be 1-256 characters without control characters`,
    );
  }
  if (seq !== undefined && !isSequenceNumber(seq)) {
    throw new RangeError(
      `sequence ${String(seq)} must be an integer from 0 to ${MAX_SEQUENCE_NUMBER}`,
    );
  }
}

// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f]/;

/**
 * 1–256 characters, none of them control characters or lone surrogates (which UTF-8 turns into
 * one U+FFFD each, so that two keys would become one in Redis).
 */
export function isResequencerKey(value: unknown): value is string {
  return (
    typeof value === 'string' &&
    value.length > 0 &&
    value.length <= 256 &&
    !CONTROL.test(value) &&
    !hasLoneSurrogate(value)
  );
}

/** The largest sequence number: its successor (the next expected) must still be exact. */
export const MAX_SEQUENCE_NUMBER = Number.MAX_SAFE_INTEGER - 1;

/** The `next` of a key `resolveGap` closed: past every sequence number. */
export const CLOSED_KEY_NEXT = MAX_SEQUENCE_NUMBER + 1;

/** An integer from 0 to {@link MAX_SEQUENCE_NUMBER}. */
export function isSequenceNumber(value: unknown): value is number {
  return (
    typeof value === 'number' &&
    Number.isSafeInteger(value) &&
    value >= 0 &&
    value <= MAX_SEQUENCE_NUMBER
  );
}
