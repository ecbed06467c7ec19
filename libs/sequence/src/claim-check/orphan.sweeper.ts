import { Inject, Injectable, Logger, Optional } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { Sweeper } from '../kernel/sweeper';
import { CLAIM_CHECK_STORES, RESOLVED_OPTIONS, type ClaimCheckStores } from '../kernel/tokens';
import type { ResolvedOptions } from '../options/resolved-options';
import { deleteIfUnpublished, type PayloadStore } from '../ports/payload-store.port';
import { ClaimCheckMetrics } from './claim-check.metrics';
import { SequenceEvents } from '../kernel/lifecycle-events';
import { ClaimCheckLifecycle } from './claim-check.events';
import { errorMessage } from '../core/errors/caught';
import type { PayloadStoreCall } from '../core/errors/payload-store-timeout.error';
import { storeCallWithin } from './payload-parking';

export const ORPHAN_SWEEPER_INTERVAL = 'nest-sequence:orphan-sweeper';

/** How many payloads whose delete failed a store's sweeps remember, in batches (oldest first out). */
const FAILED_DELETES_REMEMBERED_BATCHES = 10;

/** What one sweep deleted, per reason. */
export interface OrphanSweepReport {
  readonly expired: number;
  readonly orphaned: number;
}

/**
 * Deletes parked payloads nobody will claim: those past their expiry by `expiredGraceMs` (their
 * tickets are refused from the expiry on; the grace covers handlers still reading), and those
 * stored for a `publish()` whose ticket was never confirmed, once `orphanGraceMs` has passed.
 * Safe on every instance at once: a payload deleted twice is deleted once (`delete` is
 * idempotent). An orphan is deleted only while it is still unpublished (`deleteUnpublished`):
 * one whose ticket was confirmed after the listing is kept.
 */
@Injectable()
export class OrphanSweeper extends Sweeper<OrphanSweepReport> {
  protected readonly what = 'orphan sweep';
  private readonly lifecycle: ClaimCheckLifecycle;
  /**
   * Per store, the refs whose delete failed: tried again after the others, so that payloads a
   * store refuses to delete (permissions, a retention lock) never fill every batch and keep the
   * sweep from the others for good.
   */
  private readonly failedDeletes = new Map<PayloadStore, Set<string>>();

  constructor(
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    @Inject(CLAIM_CHECK_STORES) private readonly stores: ClaimCheckStores,
    private readonly metrics: ClaimCheckMetrics,
    events: SequenceEvents,
    @Optional() schedulerRegistry?: SchedulerRegistry,
  ) {
    super(
      ORPHAN_SWEEPER_INTERVAL,
      options.tuning.sweepers.orphans,
      new Logger('ClaimCheck'),
      schedulerRegistry,
    );
    this.lifecycle = new ClaimCheckLifecycle(events);
  }

  /**
   * A sweep stuck on a store call (a hung mount, a bucket that never answers) must not hold the
   * application's shutdown. Leaving it is safe: a sweep only lists and deletes, a delete is
   * idempotent, and whatever it did not reach stays due for the next sweep of any instance.
   */
  protected override stopWaitMs(): number {
    return this.options.shutdownTimeoutMs;
  }

  protected override leftRunning(): void {
    this.logger.warn(
      `the orphan sweep in progress did not finish within shutdownTimeoutMs ` +
        `(${this.options.shutdownTimeoutMs} ms); shutting down without it: the payloads it had ` +
        'not deleted stay due for the next sweep',
    );
  }

  private within<T>(
    store: PayloadStore,
    ref: string,
    call: PayloadStoreCall,
    pending: Promise<T>,
  ): Promise<T> {
    return storeCallWithin(store, ref, call, pending, this.options.claimCheck.readTimeoutMs);
  }

  /** One sweep over every configured store. */
  protected sweepOnce(now: number): Promise<OrphanSweepReport> {
    return this.sweepAll(now);
  }

  private async sweepAll(now: number): Promise<OrphanSweepReport> {
    const totals = { expired: 0, orphaned: 0 };
    for (const store of this.stores.stores.values()) {
      let swept: OrphanSweepReport;
      try {
        swept = await this.sweepStore(store, now);
      } catch (error) {
        // One unreachable store (say, a read store being retired) must not leave the others
        // unswept; it is tried again next run, like a payload whose delete failed.
        this.logger.warn(
          `could not sweep payload store ${store.name}; will retry next run: ${errorMessage(error)}`,
        );
        continue;
      }
      totals.expired += swept.expired;
      totals.orphaned += swept.orphaned;
    }
    return totals;
  }

  private async sweepStore(store: PayloadStore, now: number): Promise<OrphanSweepReport> {
    const totals = { expired: 0, orphaned: 0 };
    const batch = this.settings.batchSize;
    const { expiredGraceMs, orphanGraceMs } = this.options.claimCheck;
    // One batch per run: a large backlog is worked off over several intervals, so that one run
    // never holds the store (or this instance) for long.
    // An expired payload is kept expiredGraceMs longer: its ticket was accepted up to expiresAt,
    // and a handler may still be reading it. Only expiresAt and this instance's clock decide, so
    // every instance agrees without asking the claim ledger (which may be per-process, and knows
    // only the groups that claimed); clock skew is part of what the grace must cover.
    const failed = this.failedDeletesOf(store);
    // Each call is given up on after readTimeoutMs: a store that stopped answering must not
    // keep this instance's sweeps, of it and of the other stores, from ever running again.
    const listed = await this.within(
      store,
      '',
      'sweepCandidates',
      store.sweepCandidates({
        now: now - expiredGraceMs,
        unpublishedBefore: now - orphanGraceMs,
        // Room for those whose delete failed before, so that a batch of others still comes.
        limit: batch + failed.size,
      }),
    );
    // Those whose delete failed before go last: tried again where the batch has room.
    const candidates = [
      ...listed.filter(({ ref }) => !failed.has(ref)),
      ...listed.filter(({ ref }) => failed.has(ref)),
    ].slice(0, batch);
    const outcomes = await Promise.allSettled(
      candidates.map(({ ref, reason }) =>
        // An orphan only while it is unpublished: its ticket may have been confirmed since the
        // listing (a slow publish, a consumer marking it), or this instance's clock runs ahead.
        this.within(
          store,
          ref,
          'delete',
          reason === 'orphaned' ? deleteIfUnpublished(store, ref) : store.delete(ref),
        ),
      ),
    );
    outcomes.forEach((outcome, index) => {
      const { ref, reason } = candidates[index];
      if (outcome.status === 'rejected') {
        this.logger.warn(
          `could not delete ${reason} payload ${store.name}:${ref} (tried again after the ` +
            `others): ${errorMessage(outcome.reason)}`,
        );
        this.rememberFailedDelete(failed, ref, batch);
        return;
      }
      failed.delete(ref);
      if (!outcome.value) return; // another instance was first, or the orphan was published
      totals[reason]++;
      this.metrics.payloadDeleted(store.name, reason);
      this.lifecycle.deleted('', store.name, ref, reason);
    });
    if (totals.expired + totals.orphaned > 0) {
      this.logger.log(
        `swept ${totals.expired} expired and ${totals.orphaned} orphaned payload(s) from ${store.name}`,
      );
    }
    return totals;
  }

  private failedDeletesOf(store: PayloadStore): Set<string> {
    let failed = this.failedDeletes.get(store);
    if (!failed) {
      failed = new Set();
      this.failedDeletes.set(store, failed);
    }
    return failed;
  }

  /** Bounded: past its size, the ref remembered longest is forgotten (and taken in turn again). */
  private rememberFailedDelete(failed: Set<string>, ref: string, batch: number): void {
    failed.delete(ref);
    failed.add(ref);
    const most = batch * FAILED_DELETES_REMEMBERED_BATCHES;
    for (const oldest of failed) {
      if (failed.size <= most) break;
      failed.delete(oldest);
    }
  }
}
