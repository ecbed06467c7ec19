import type { Logger } from '@nestjs/common';
import type { ResequencerKey, ResequencerStore } from '../ports/resequencer-store.port';
import { errorMessage } from '../core/errors/caught';
import type { DeliveryGuard } from './hand-off.deliverer';
import {
  leaseClock,
  leaseLater,
  leaseLatest,
  leaseMsLeft,
  type LeaseInstant,
} from '../core/lease-clock';

/**
 * A key's drain lease as its holder keeps it while it delivers: renewed every third of
 * `leaseMs`, and counted as lost as soon as it may have passed to another holder — when a
 * renewal finds it gone, or when no claim, settle or renewal has confirmed it for most of
 * `leaseMs` (renewals failing, an event loop stalled): the holder must then stop before its next
 * delivery, or two instances would deliver one key at once.
 *
 * Renewal never takes a lease (`renewDrain`), and pauses around each settle, so that a renewal
 * in flight never races the settle that releases the lease.
 */
export class DrainLease implements DeliveryGuard {
  private validUntil: LeaseInstant;
  private renewedAway = false;
  private paused = false;
  private inFlight: Promise<void> = Promise.resolve();
  private readonly timer: NodeJS.Timeout;
  /** Stop this long before the lease could lapse: time for the delivery that has begun. */
  private readonly marginMs: number;

  constructor(
    private readonly store: ResequencerStore,
    private readonly ref: ResequencerKey,
    private readonly holder: string,
    private readonly leaseMs: number,
    /** When the claim that granted the lease was sent (the lease runs from the store's `now`). */
    claimedAt: LeaseInstant,
    private readonly logger: Logger,
  ) {
    this.validUntil = leaseLater(claimedAt, leaseMs);
    this.marginMs = Math.floor(leaseMs / 5);
    this.timer = setInterval(() => this.renew(), Math.max(50, Math.floor(leaseMs / 3)));
    this.timer.unref();
  }

  /** True once the lease may belong to someone else: deliver nothing more. */
  lost(): boolean {
    return !this.allows(0);
  }

  /**
   * Whether an attempt begun now that takes up to `ms` ends before the lease could lapse (with
   * the margin): a publish attempt is bounded by its confirm timeout; a handler call is not,
   * which is why a handler is not retried once the lease may lapse.
   */
  allows(ms: number): boolean {
    return !this.renewedAway && leaseMsLeft(this.validUntil) > ms + this.marginMs;
  }

  /** A settle sent at `sentAt` renewed the lease (it answered with the next batch). */
  confirmed(sentAt: LeaseInstant): void {
    this.validUntil = leaseLatest(this.validUntil, leaseLater(sentAt, this.leaseMs));
  }

  async pause(): Promise<void> {
    this.paused = true;
    await this.inFlight;
  }

  resume(): void {
    this.paused = false;
  }

  stop(): void {
    clearInterval(this.timer);
  }

  private renew(): void {
    if (this.paused || this.renewedAway) return;
    const sentAt = leaseClock();
    this.inFlight = this.store.renewDrain(this.ref, this.holder, this.leaseMs, Date.now()).then(
      (renewed) => {
        if (renewed) this.confirmed(sentAt);
        else this.renewedAway = true;
      },
      // Unconfirmed, the lease runs out on its own: lost() says so in time.
      (error: unknown) =>
        this.logger.warn(
          `could not renew the drain lease of ${this.ref.scope}/${this.ref.key}: ${errorMessage(error)}`,
        ),
    );
  }
}
