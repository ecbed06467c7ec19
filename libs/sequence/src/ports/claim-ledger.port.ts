/** Which delivery of which ticket a claim is about. */
export interface ClaimKey {
  /** The ticket's identity, `${store}:${ref}`: the same payload gives the same ticket string. */
  readonly ticket: string;
  /**
   * The consumer group: the consuming channel or queue. Every group handles a ticket once;
   * groups do not see each other's claims, only count each other's completions.
   */
  readonly group: string;
}

/**
 * - `claimed`: the caller holds the lease and must run the handler, then `complete` or `release`.
 * - `done`: this group already completed this ticket: a duplicate delivery; ack it, skip the handler.
 * - `busy`: another holder's lease is live (or the ledger is full): requeue the message for later.
 */
export type ClaimOutcome = 'claimed' | 'done' | 'busy';

/** What `complete` reports: the reference count that `deleteAfter: { consumers: N }` acts on. */
export interface Completion {
  /** Distinct groups that have completed the ticket and are still retained, this one included. */
  readonly groups: number;
  /** Whether this call marked the group done (`false`: it already was, e.g. a repeated call). */
  readonly first: boolean;
}

/**
 * The small record shared by every consumer instance that makes "the same ticket delivered twice
 * runs the handler once" and reference-counted fan-out true. The contract, which the
 * conformance suite (`libs/sequence/src/testing/conformance/claim-ledger.conformance.ts`) checks for every adapter:
 *
 * - `claim` is atomic across instances: of any number of concurrent claims of one key, at most
 *   one answers `claimed` while its lease is live. A lease is live while `now < until`, where
 *   `until = now + leaseMs` of the claim that took or last renewed it; a lapsed lease can be
 *   taken over by anyone, and a claim by the current holder renews it.
 * - A completed group answers `done` to every claim until `retainUntil`; afterwards the record
 *   is gone (the ledger is bounded), and a claim is `claimed` again.
 * - Groups are independent: one group's lease or completion never blocks or completes another.
 * - Times (`now`, `retainUntil`) are epoch ms passed in by the caller, so tests control time and
 *   every decision is made on them; a server-backed adapter also expires its keys in real time
 *   (after the same durations plus a margin) so that nothing leaks when no caller comes back.
 * - Arguments are validated: ticket, group and holder are non-empty strings, times are safe
 *   integers, `leaseMs > 0` and `retainUntil > now`; anything else throws a `RangeError`.
 * - `ping` rejects when the backing service is unreachable; `close` releases connections the
 *   ledger owns.
 */
export interface ClaimLedger {
  /** The adapter's name, e.g. `memory`, `redis` (for logs and the health indicator). */
  readonly name: string;

  /**
   * Asks to run the handler for `key`. `claimed`: the caller now holds the lease until
   * `now + leaseMs` (a claim by the current holder renews it); `done`: this group already
   * completed this ticket (a duplicate: ack and skip); `busy`: another holder's lease is live
   * (requeue later). A lapsed lease can be taken over.
   */
  claim(key: ClaimKey, holder: string, leaseMs: number, now: number): Promise<ClaimOutcome>;

  /**
   * Marks the group done, kept until `retainUntil` so that late duplicates are recognised even
   * after the payload was deleted, and returns how many distinct groups have completed this
   * ticket (the reference count). Idempotent per group: a repeated call answers `first: false`
   * and keeps the later `retainUntil`. Completes even if the holder's lease lapsed, or another
   * holder took it over meanwhile (the handler's effect already happened): the completion ends
   * the group's lease, whoever holds it, and that holder's own `complete` then answers
   * `first: false`.
   */
  complete(key: ClaimKey, holder: string, retainUntil: number, now: number): Promise<Completion>;

  /**
   * The holder gives its lease up (the handler failed; the message will be retried), so that
   * the redelivery can be claimed at once. No-op if `holder` does not hold the lease.
   */
  release(key: ClaimKey, holder: string): Promise<void>;

  ping(): Promise<void>;
  close(): Promise<void>;
}

/** The times of one ledger call, as far as it takes them (all epoch ms or ms). */
export interface ClaimTimes {
  readonly now?: number;
  readonly leaseMs?: number;
  readonly retainUntil?: number;
}

/**
 * Throws a `RangeError` naming the first invalid argument of a ledger call; adapters call it
 * first so that every adapter rejects the same inputs.
 */
export function assertClaimArguments(key: ClaimKey, holder: string, times: ClaimTimes = {}): void {
  const strings = { ticket: key.ticket, group: key.group, holder } as const;
  for (const [name, value] of Object.entries(strings)) {
    if (typeof value !== 'string' || value.length === 0) {
      throw new RangeError(
        `claim ledger: ${name} must be a non-empty string, got ${JSON.stringify(value)}`,
      );
    }
  }
  for (const [name, value] of Object.entries(times)) {
    if (!Number.isSafeInteger(value)) {
      throw new RangeError(`claim ledger: ${name} must be an integer (ms), got ${String(value)}`);
    }
  }
  const { now, leaseMs, retainUntil } = times;
  if (leaseMs !== undefined && leaseMs <= 0) {
    throw new RangeError(`claim ledger: leaseMs must be > 0, got ${leaseMs}`);
  }
  if (retainUntil !== undefined && now !== undefined && retainUntil <= now) {
    throw new RangeError(
      `claim ledger: retainUntil (${retainUntil}) must be after now (${now}); ` +
        'retain completions at least until the ticket expires',
    );
  }
}
