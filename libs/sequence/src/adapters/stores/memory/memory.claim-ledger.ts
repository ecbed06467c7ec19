import { checkOptionKeys, type OptionKeysOf } from '../../../core/option-keys';
import {
  assertClaimArguments,
  type ClaimKey,
  type ClaimLedger,
  type ClaimOutcome,
  type Completion,
} from '../../../ports/claim-ledger.port';
import { checkInteger } from '../../../core/option-checks';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

export interface MemoryClaimLedgerOptions {
  /**
   * Most records kept at once, leases and completions together (one per ticket and group).
   * When a new record would pass it, lapsed leases and completions past their `retainUntil` go
   * first, then the oldest completions (a duplicate of an evicted ticket arriving later runs its
   * handler again); a claim that still finds no room, because every record is a live lease,
   * answers `busy` (back-pressure) instead of growing the ledger.
   * @default 100_000
   */
  readonly maxEntries?: number;
  /**
   * At most how often (in the callers' `now`) a call also sweeps every record that has lapsed,
   * besides the records it touches itself: what bounds memory when no cap is reached.
   * @default 10_000
   */
  readonly sweepIntervalMs?: number;
}

const MEMORY_CLAIM_LEDGER_KEYS = {
  maxEntries: true,
  sweepIntervalMs: true,
} as const satisfies OptionKeysOf<MemoryClaimLedgerOptions>;

interface Lease {
  readonly holder: string;
  readonly until: number;
}

interface CompletedPair {
  readonly ticket: string;
  readonly group: string;
}

/**
 * The default {@link ClaimLedger}: records in this process's memory, for one consumer instance
 * (another instance does not see them, and they are lost on restart).
 *
 * Every method runs synchronously to its end once called, so concurrent claims are serialized
 * by the event loop. Records are dropped after their `retainUntil` or lease lapse: lazily, when
 * a call touches them, and in a sweep of all of them at most once per `sweepIntervalMs` or when
 * `maxEntries` is reached (see its doc for what is evicted then).
 */
export class MemoryClaimLedger implements ClaimLedger {
  readonly name = 'memory';

  private readonly maxEntries: number;
  private readonly sweepIntervalMs: number;
  private readonly leases = new Map<string, Lease>();
  /** ticket → group → retainUntil. */
  private readonly completed = new Map<string, Map<string, number>>();
  /** The same completions in the order they were recorded: the eviction order. */
  private readonly completionOrder = new Map<string, CompletedPair>();
  private nextSweepAt = Number.NEGATIVE_INFINITY;

  constructor(options: MemoryClaimLedgerOptions = {}) {
    this.maxEntries = options.maxEntries ?? 100_000;
    this.sweepIntervalMs = options.sweepIntervalMs ?? 10_000;
    const problems: string[] = [];
    checkOptionKeys(problems, options, MEMORY_CLAIM_LEDGER_KEYS);
    checkInteger(problems, 'maxEntries', this.maxEntries, 1);
    checkInteger(problems, 'sweepIntervalMs', this.sweepIntervalMs, 0);
    if (problems.length > 0) throw new SequenceOptionsError('MemoryClaimLedger options', problems);
  }

  /** Records held now (leases plus completions), lapsed ones not swept yet included. */
  get entries(): number {
    return this.leases.size + this.completionOrder.size;
  }

  async claim(key: ClaimKey, holder: string, leaseMs: number, now: number): Promise<ClaimOutcome> {
    assertClaimArguments(key, holder, { leaseMs, now });
    this.sweepIfDue(now);
    if (this.liveGroups(key.ticket, now).has(key.group)) return 'done';

    const pair = pairKey(key);
    const lease = this.leases.get(pair);
    if (lease && lease.until > now && lease.holder !== holder) return 'busy';
    // A lapsed or own lease is replaced in place; only a new record needs room.
    if (!lease && !this.makeRoom(now, 1)) return 'busy';
    this.leases.set(pair, { holder, until: now + leaseMs });
    return 'claimed';
  }

  async complete(
    key: ClaimKey,
    holder: string,
    retainUntil: number,
    now: number,
  ): Promise<Completion> {
    assertClaimArguments(key, holder, { retainUntil, now });
    this.sweepIfDue(now);
    const pair = pairKey(key);
    // The completion outranks any lease of the group: every later claim answers `done`.
    this.leases.delete(pair);

    const groups = this.liveGroups(key.ticket, now);
    const retained = groups.get(key.group);
    if (retained !== undefined) {
      groups.set(key.group, Math.max(retained, retainUntil));
      return { groups: groups.size, first: false };
    }
    groups.set(key.group, retainUntil);
    this.completed.set(key.ticket, groups);
    this.completionOrder.set(pair, { ticket: key.ticket, group: key.group });
    // Never refused: the handler's effect already happened. Room is made by evicting older
    // completions; with only live leases left, the ledger passes the cap by this record until
    // the next sweep or eviction.
    this.makeRoom(now, 0, pair);
    return { groups: this.completed.get(key.ticket)?.size ?? 0, first: true };
  }

  async release(key: ClaimKey, holder: string): Promise<void> {
    assertClaimArguments(key, holder);
    const pair = pairKey(key);
    if (this.leases.get(pair)?.holder === holder) this.leases.delete(pair);
  }

  async ping(): Promise<void> {}

  /** Forgets every record (the ledger's state lives only as long as this process uses it). */
  async close(): Promise<void> {
    this.leases.clear();
    this.completed.clear();
    this.completionOrder.clear();
  }

  /** The ticket's completions still retained at `now` (the map is live: callers may add to it). */
  private liveGroups(ticket: string, now: number): Map<string, number> {
    const groups = this.completed.get(ticket);
    if (!groups) return new Map();
    for (const [group, retainUntil] of groups) {
      if (retainUntil <= now) this.forgetCompletion(ticket, group);
    }
    return groups;
  }

  private forgetCompletion(ticket: string, group: string): void {
    const groups = this.completed.get(ticket);
    if (!groups) return;
    groups.delete(group);
    if (groups.size === 0) this.completed.delete(ticket);
    this.completionOrder.delete(pairKey({ ticket, group }));
  }

  /**
   * Whether `incoming` more records fit under the cap, after sweeping and evicting the oldest
   * completions (never `keep`) as needed.
   */
  private makeRoom(now: number, incoming: number, keep?: string): boolean {
    if (this.entries + incoming <= this.maxEntries) return true;
    this.sweep(now);
    for (const [pair, { ticket, group }] of this.completionOrder) {
      if (this.entries + incoming <= this.maxEntries) break;
      if (pair !== keep) this.forgetCompletion(ticket, group);
    }
    return this.entries + incoming <= this.maxEntries;
  }

  private sweepIfDue(now: number): void {
    if (now >= this.nextSweepAt) this.sweep(now);
  }

  /** Drops every lapsed lease and every completion past its `retainUntil`. */
  private sweep(now: number): void {
    this.nextSweepAt = now + this.sweepIntervalMs;
    for (const [pair, lease] of this.leases) {
      if (lease.until <= now) this.leases.delete(pair);
    }
    for (const ticket of [...this.completed.keys()]) this.liveGroups(ticket, now);
  }
}

/** One string per (ticket, group), unambiguous whatever characters either holds. */
function pairKey(key: ClaimKey): string {
  return JSON.stringify([key.ticket, key.group]);
}
