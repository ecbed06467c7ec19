import type { Logger } from '@nestjs/common';
import { settlesWithin, withTimeout } from '../core/async';
import { errorMessage } from '../core/errors/caught';
import { ClaimLeaseLostError } from '../core/errors/claim-lease-lost.error';
import { ClaimLedgerTimeoutError } from '../core/errors/claim-ledger-timeout.error';
import {
  leaseClock,
  leaseLater,
  leaseLatest,
  leaseMsLeft,
  type LeaseInstant,
} from '../core/lease-clock';
import type { ClaimKey, ClaimLedger } from '../ports/claim-ledger.port';

/**
 * A ticket's claim as its holder keeps it while the ticket's handler runs (as the Resequencer's
 * DrainLease does a key's): renewed every third of `leaseMs`, each renewal given up on after that
 * third, so that one that never answers does not hold back the next. Counted as lost as soon as
 * it may pass to another holder — a renewal finds it taken, or none has confirmed it for all but
 * a fifth of `leaseMs` — and `signal` then aborts with a {@link ClaimLeaseLostError}: the handler
 * must stop, or another delivery of the ticket could run it at the same time.
 */
export class ClaimLease {
  private validUntil: LeaseInstant;
  private readonly lost = new AbortController();
  /** Renewal calls sent and not answered yet, given up on or not. */
  private readonly pending = new Set<Promise<unknown>>();
  private readonly renewTimer: NodeJS.Timeout;
  private lapseTimer: NodeJS.Timeout | undefined;
  private readonly everyMs: number;
  /** Counted lost this long before it could lapse: time for the handler to stop. */
  private readonly marginMs: number;
  private stopped = false;

  constructor(
    private readonly ledger: ClaimLedger,
    private readonly key: ClaimKey,
    private readonly holder: string,
    private readonly leaseMs: number,
    /** When the claim that granted the lease was sent (the lease runs from then). */
    claimedAt: LeaseInstant,
    private readonly logger: Logger,
  ) {
    this.validUntil = leaseLater(claimedAt, leaseMs);
    this.marginMs = Math.floor(leaseMs / 5);
    this.everyMs = Math.max(50, Math.floor(leaseMs / 3));
    this.renewTimer = setInterval(() => this.renew(), this.everyMs);
    this.renewTimer.unref();
    this.watch();
  }

  /** Aborted, with a {@link ClaimLeaseLostError}, once the lease may belong to someone else. */
  get signal(): AbortSignal {
    return this.lost.signal;
  }

  /**
   * Stops renewing; resolves once no renewal is on its way (one landing after the release
   * would take the lease again, and keep the redelivery busy until it lapsed), or after
   * `leaseMs` at most: a ledger that never answers must not hold the message.
   */
  async stop(): Promise<void> {
    this.end();
    if (this.pending.size === 0) return;
    if (!(await settlesWithin(Promise.allSettled([...this.pending]), this.leaseMs))) {
      this.logger.warn(
        `a renewal of the claim on ${this.key.ticket} has not answered within ` +
          `${this.leaseMs} ms; going on without it`,
      );
    }
  }

  private end(): void {
    this.stopped = true;
    clearInterval(this.renewTimer);
    clearTimeout(this.lapseTimer);
  }

  /** Counts the lease lost once it is within the margin of lapsing, unless confirmed first. */
  private watch(): void {
    clearTimeout(this.lapseTimer);
    if (this.stopped) return;
    const dueMs = leaseMsLeft(this.validUntil) - this.marginMs;
    this.lapseTimer = setTimeout(
      () => {
        if (leaseMsLeft(this.validUntil) - this.marginMs <= 0) this.lose('unconfirmed');
        else this.watch();
      },
      Math.max(0, dueMs),
    );
    this.lapseTimer.unref();
  }

  private lose(why: 'taken' | 'unconfirmed'): void {
    if (this.stopped) return;
    this.end();
    const error = new ClaimLeaseLostError(
      this.ledger.name,
      this.key.ticket,
      this.key.group,
      why,
      this.leaseMs,
    );
    this.logger.warn(errorMessage(error));
    this.lost.abort(error);
  }

  private renew(): void {
    if (this.stopped) return;
    const sentAt = leaseClock();
    const call = this.ledger.claim(this.key, this.holder, this.leaseMs, Date.now());
    this.pending.add(call);
    const forget = () => this.pending.delete(call);
    call.then(forget, forget);
    withTimeout(
      call,
      this.everyMs,
      () =>
        new ClaimLedgerTimeoutError(
          this.ledger.name,
          'claim',
          this.key.ticket,
          this.key.group,
          this.everyMs,
          'a third of tuning.leaseMs, renewing',
        ),
    ).then(
      (outcome) => {
        if (outcome !== 'claimed') return this.lose('taken');
        this.validUntil = leaseLatest(this.validUntil, leaseLater(sentAt, this.leaseMs));
        this.watch();
      },
      // Unconfirmed, the lease runs out on its own: the watch says so in time.
      (error: unknown) =>
        this.logger.warn(`could not renew the claim on ${this.key.ticket}: ${errorMessage(error)}`),
    );
  }
}
