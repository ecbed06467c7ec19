import type { OutboxMetrics } from './outbox.metrics';
import { ClaimCommitRefusedError } from '../core/errors/claim-commit-refused.error';
import type {
  BoxName,
  ClaimedBatch,
  ClaimResult,
  OutboxStore,
  RecordOutcome,
  StoredRecord,
} from '../ports/outbox-store.port';
import type { ResolvedBoxOptions } from '../options/resolved-options';
import { failedAttempt } from './retry-schedule';
import type { BoxLifecycle } from './outbox.events';

/**
 * How far past `retry.maxDelayMs` a retry time may lie before a claim takes it for one written on
 * a clock ahead. Claims run beside each other: one that read the clock later (after a wait for a
 * connection, say) schedules a retry past this claim's `now + maxDelayMs`, on the same clock.
 */
export const RETRY_HORIZON_MARGIN_MS = 60_000;

/** What one claim's handling tells its cycle. */
export interface CycleState {
  /**
   * Wait for the next wake-up or poll rather than claim again at once, even after a full batch
   * (a relay whose broker is unreachable).
   */
  holdOff: boolean;
  /** Called once the claim's transaction has committed. */
  committed?: () => void;
  /**
   * Called when the database refused the claim's COMMIT (`ClaimCommitRefusedError`); true when
   * the worker took it in hand: the cycle then reports more to do (claim again at once) rather
   * than failing.
   */
  refused?: (error: ClaimCommitRefusedError) => boolean;
}

/**
 * What a relay and an inbox processor share: one claim per cycle of their box, with its options,
 * and the retry-or-fail decision (counted in the metrics) for a record whose attempt failed.
 */
export abstract class BoxWorker<Box extends BoxName = BoxName> {
  protected stopping = false;
  /** Whether a `transaction()` in this worker's handling joins its claim (see ClaimOptions). */
  protected readonly joinsClaim: boolean = true;
  /** Whether its claims' outcomes must be on disk when they resolve (see ClaimOptions). */
  protected readonly settlesDurably: boolean = true;

  protected constructor(
    readonly box: Box,
    protected readonly store: OutboxStore,
    protected readonly options: ResolvedBoxOptions,
    protected readonly metrics: OutboxMetrics,
    protected readonly lifecycle: BoxLifecycle,
  ) {}

  /**
   * One claim; true when the batch was full (there may be more due at once). `locked` is told
   * when the batch is locked, before it is handled.
   */
  async cycle(locked?: () => void): Promise<boolean> {
    const { batchSize, ordered, retry } = this.options;
    const cycle: CycleState = { holdOff: false };
    const now = Date.now();
    let result: ClaimResult;
    try {
      result = await this.store.claim(
        this.box,
        {
          limit: batchSize,
          now,
          // A retry time further ahead than this box ever schedules one is a clock's error.
          horizon: now + retry.maxDelayMs + RETRY_HORIZON_MARGIN_MS,
          ordered,
          joinable: this.joinsClaim,
          durable: this.settlesDurably,
          // Only an outbox may have no retention (an inbox's completed ids are its memory).
          deleteCompleted: this.options.retentionMs === 0,
        },
        (batch) => {
          locked?.();
          return this.handleBatch(batch, cycle);
        },
      );
    } catch (error) {
      if (error instanceof ClaimCommitRefusedError && cycle.refused?.(error)) return !this.stopping;
      throw error;
    }
    cycle.committed?.();
    return result.claimed >= batchSize && !this.stopping && !cycle.holdOff;
  }

  /**
   * Records in progress finish; no record is started after this (the rest stay `PENDING`).
   * `graceMs`: how long a handler still running may take before it is abandoned (see
   * InboxProcessor); a relay's publishes end within their confirm timeouts on their own.
   */
  stop(_graceMs?: number): void {
    this.stopping = true;
  }

  protected abstract handleBatch(batch: ClaimedBatch, cycle: CycleState): Promise<RecordOutcome[]>;

  /** Retry later, or `FAILED` after `retry.attempts` (at once when `final`). */
  protected failed(record: StoredRecord, error: unknown, final = false): RecordOutcome {
    const outcome = failedAttempt(record, error, Date.now(), this.options, final);
    this.metrics.attemptFailed(this.box, outcome.status === 'failed' ? 'failed' : 'retry');
    this.lifecycle.attemptFailed(record, outcome, () => this.channelOf(record));
    return outcome;
  }

  /** The channel a record's events name (see BoxLifecycleEvent); asked only for a listener. */
  protected abstract channelOf(record: StoredRecord): string;
}
