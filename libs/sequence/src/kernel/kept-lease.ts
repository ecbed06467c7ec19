import type { Logger } from '@nestjs/common';
import { settlesWithin, withTimeout } from '../core/async';
import { errorMessage } from '../core/errors/caught';
import {
  leaseClock,
  leaseLater,
  leaseLatest,
  leaseMsLeft,
  msSince,
  type LeaseInstant,
} from '../core/lease-clock';

/** Why a kept lease counts as lost: a renewal found another holder, or none confirmed it. */
export type LeaseLoss = 'taken' | 'unconfirmed';

/** What a {@link KeptLease} keeps: how to renew it, and what to say when it is lost. */
export interface LeaseTerms {
  /** Names the lease in log lines: `the claim on <ticket>`. */
  readonly name: string;
  /** Renews the lease for `leaseMs` from now; false when another holder has it (or it is over). */
  renew(): Promise<boolean>;
  /** The error a renewal given up on after `ms` is logged with (by default a plain one). */
  renewalTimeout?(ms: number): Error;
  /** The error `signal` aborts with. */
  lost(why: LeaseLoss): Error;
}

/**
 * A lease its holder keeps while a handler runs under it (a Claim Check ticket's claim, a
 * sequence's completion lease): renewed every third of `leaseMs`, each renewal given up on after
 * that third, so that one that never answers does not hold back the next. Counted as lost as soon
 * as it may pass to another holder — a renewal finds it taken, or none has confirmed it for all
 * but a fifth of `leaseMs` — and `signal` then aborts with the terms' error: the handler must
 * stop, or another delivery could run it at the same time.
 */
export class KeptLease {
  private validUntil: LeaseInstant;
  private readonly lostController = new AbortController();
  /** Renewal calls sent and not answered yet, given up on or not. */
  private readonly pending = new Set<Promise<unknown>>();
  private renewTimer: NodeJS.Timeout;
  private lapseTimer: NodeJS.Timeout | undefined;
  private readonly everyMs: number;
  /** Counted lost this long before it could lapse: time for the handler to stop. */
  private readonly marginMs: number;
  private stopped = false;

  constructor(
    private readonly terms: LeaseTerms,
    private readonly leaseMs: number,
    /** When the call that granted the lease was sent (the lease runs from then). */
    grantedAt: LeaseInstant,
    private readonly logger: Logger,
  ) {
    this.validUntil = leaseLater(grantedAt, leaseMs);
    this.marginMs = Math.floor(leaseMs / 5);
    this.everyMs = Math.max(50, Math.floor(leaseMs / 3));
    // The first renewal a third of the lease after its grant, not after this start: the work
    // between them (the rest of an accept, a digest) must not eat into the renewals' margin.
    this.renewTimer = setTimeout(
      () => {
        if (this.stopped) return;
        this.renewTimer = setInterval(() => this.renew(), this.everyMs);
        this.renewTimer.unref();
        this.renew();
      },
      Math.max(0, this.everyMs - msSince(grantedAt)),
    );
    this.renewTimer.unref();
    this.watch();
  }

  /** Aborted, with the terms' `lost` error, once the lease may belong to someone else. */
  get signal(): AbortSignal {
    return this.lostController.signal;
  }

  /**
   * Stops renewing; resolves once no renewal is on its way (one landing after a release would
   * take the lease again, and keep the redelivery busy until it lapsed), or after `leaseMs` at
   * most: a store that never answers must not hold the message.
   */
  async stop(): Promise<void> {
    this.end();
    if (this.pending.size === 0) return;
    if (!(await settlesWithin(Promise.allSettled([...this.pending]), this.leaseMs))) {
      this.logger.warn(
        `a renewal of ${this.terms.name} has not answered within ${this.leaseMs} ms; going on ` +
          'without it',
      );
    }
  }

  /** Stops renewing, without waiting for a renewal on its way (see `stop`). */
  end(): void {
    this.stopped = true;
    clearTimeout(this.renewTimer);
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

  private lose(why: LeaseLoss): void {
    if (this.stopped) return;
    this.end();
    const error = this.terms.lost(why);
    this.logger.warn(errorMessage(error));
    this.lostController.abort(error);
  }

  private renew(): void {
    if (this.stopped) return;
    const sentAt = leaseClock();
    const call = this.terms.renew();
    this.pending.add(call);
    const forget = () => this.pending.delete(call);
    call.then(forget, forget);
    const timeout = () =>
      this.terms.renewalTimeout?.(this.everyMs) ??
      new Error(`no answer within ${this.everyMs} ms (a third of tuning.leaseMs)`);
    withTimeout(call, this.everyMs, timeout).then(
      (held) => {
        if (!held) return this.lose('taken');
        this.validUntil = leaseLatest(this.validUntil, leaseLater(sentAt, this.leaseMs));
        this.watch();
      },
      // Unconfirmed, the lease runs out on its own: the watch says so in time.
      (error: unknown) =>
        this.logger.warn(`could not renew ${this.terms.name}: ${errorMessage(error)}`),
    );
  }
}
