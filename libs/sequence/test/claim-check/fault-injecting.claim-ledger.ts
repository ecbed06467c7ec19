import { MemoryClaimLedger } from 'nest-sequence';
import type { ClaimKey, ClaimOutcome, Completion } from 'nest-sequence/ports';

/** A call that never settles, as on a ledger that stopped answering. */
function never<T>(): Promise<T> {
  return new Promise<T>(() => undefined);
}

/**
 * A real {@link MemoryClaimLedger} whose calls stop answering on command, as a ledger behind a
 * frozen connection does. Counts are of upcoming calls; each hang uses one up. A call that hangs
 * "after recording" reaches the ledger (the claim is taken, the completion recorded) and its
 * reply never comes; otherwise it never reaches it.
 */
export class FaultInjectingClaimLedger extends MemoryClaimLedger {
  /** Upcoming `claim` calls that never settle, nothing recorded. */
  hangClaims = 0;
  /** Upcoming `claim` calls that take the claim, then never answer. */
  hangClaimsAfterRecording = 0;
  /**
   * Upcoming renewals (`claim` calls by a holder that claimed the key before) that never
   * settle, nothing recorded; taken before `hangClaims`.
   */
  hangRenewals = 0;
  /** Upcoming `complete` calls that never settle, nothing recorded. */
  hangCompletes = 0;
  /** Upcoming `complete` calls that record the completion, then never answer. */
  hangCompletesAfterRecording = 0;
  /** Upcoming `release` calls that never settle, the lease kept. */
  hangReleases = 0;
  readonly calls = { claim: 0, complete: 0, release: 0 };
  /** What each claim that reached the ledger answered (hung replies included), in order. */
  readonly claimOutcomes: ClaimOutcome[] = [];
  private readonly claimants = new Set<string>();

  override async claim(
    key: ClaimKey,
    holder: string,
    leaseMs: number,
    now: number,
  ): Promise<ClaimOutcome> {
    this.calls.claim++;
    const claimant = JSON.stringify([key.ticket, key.group, holder]);
    if (this.claimants.has(claimant) && this.hangRenewals > 0) {
      this.hangRenewals--;
      return never();
    }
    this.claimants.add(claimant);
    if (this.hangClaims > 0) {
      this.hangClaims--;
      return never();
    }
    const outcome = await super.claim(key, holder, leaseMs, now);
    this.claimOutcomes.push(outcome);
    if (this.hangClaimsAfterRecording > 0) {
      this.hangClaimsAfterRecording--;
      return never();
    }
    return outcome;
  }

  override async complete(
    key: ClaimKey,
    holder: string,
    retainUntil: number,
    now: number,
  ): Promise<Completion> {
    this.calls.complete++;
    if (this.hangCompletes > 0) {
      this.hangCompletes--;
      return never();
    }
    const completion = await super.complete(key, holder, retainUntil, now);
    if (this.hangCompletesAfterRecording > 0) {
      this.hangCompletesAfterRecording--;
      return never();
    }
    return completion;
  }

  override async release(key: ClaimKey, holder: string): Promise<void> {
    this.calls.release++;
    if (this.hangReleases > 0) {
      this.hangReleases--;
      return never();
    }
    return super.release(key, holder);
  }
}
