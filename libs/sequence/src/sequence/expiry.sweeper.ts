import { Inject, Injectable, Logger, Optional } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { settlesWithin, withTimeout } from '../core/async';
import { deathReason } from '../core/errors/rejection-code';
import { SequenceHeader } from '../core/headers';
import { DeadLetterMetrics } from '../kernel/dead-letter.metrics';
import { publishWithRetry } from '../kernel/publish-with-retry';
import { Sweeper } from '../kernel/sweeper';
import {
  RESOLVED_OPTIONS,
  BOUNDED_SEQUENCE_STORE,
  SEQUENCE_STORE,
  SEQUENCE_TRANSPORT,
} from '../kernel/tokens';
import type { ResolvedOptions } from '../options/resolved-options';
import type { ExpiredSequence, SequenceRef, SequenceStore } from '../ports/sequence-store.port';
import type { Transport } from '../ports/transport.port';
import { AggregatorService } from './aggregator.service';
import { refSubject, storeStepWithin } from './bounded-store';
import { SequenceMetrics } from './sequence.metrics';
import { SequenceEvents } from '../kernel/lifecycle-events';
import { SequenceLifecycle } from './sequence.events';
import { errorMessage } from '../core/errors/caught';
import { SequenceStoreTimeoutError } from '../core/errors/sequence-store-timeout.error';

export const EXPIRY_SWEEPER_INTERVAL = 'nest-sequence:expiry-sweeper';

/**
 * Expires incomplete sequences whose deadline passed: frees their buffer, calls `onExpired`, and
 * puts an expired-sequence record on the channel's dead-letter channel. Every instance may sweep:
 * the store's `expire` hands each sequence to exactly one of them.
 */
@Injectable()
export class ExpirySweeper extends Sweeper<number> {
  protected readonly what = 'expiry sweep';
  private readonly lifecycle: SequenceLifecycle;
  /** Reports of claims that answered after the sweep stopped waiting (see claim). */
  private readonly lateReports = new Set<Promise<void>>();

  constructor(
    @Inject(BOUNDED_SEQUENCE_STORE) private readonly store: SequenceStore,
    /** The store itself: its `expire` is bounded here (see claim). */
    @Inject(SEQUENCE_STORE) private readonly unbounded: SequenceStore,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    private readonly aggregator: AggregatorService,
    private readonly metrics: SequenceMetrics,
    private readonly deadLetters: DeadLetterMetrics,
    events: SequenceEvents,
    @Optional() schedulerRegistry?: SchedulerRegistry,
  ) {
    super(
      EXPIRY_SWEEPER_INTERVAL,
      options.tuning.sweepers.expiry,
      new Logger('SequenceModule'),
      schedulerRegistry,
    );
    this.lifecycle = new SequenceLifecycle(events);
  }

  /** How long the `onExpired` hook of one expired sequence is awaited. */
  private hookMs(): number {
    return Math.max(this.options.shutdownTimeoutMs, this.options.publish.confirmTimeoutMs);
  }

  /**
   * The sweep in progress stops after the batch it is reporting (each report is bounded by the
   * hook's and the publish's timeouts); the store calls before it get shutdownTimeoutMs.
   */
  protected override stopWaitMs(): number {
    return this.options.shutdownTimeoutMs + this.hookMs() + this.options.publish.confirmTimeoutMs;
  }

  protected override leftRunning(): void {
    this.logger.warn(
      'the expiry sweep in progress did not finish before shutdown: the sequences it had not ' +
        'claimed stay due for the next sweep, but those it had claimed and was still reporting ' +
        'may lose their expiry record and onExpired call',
    );
  }

  /**
   * Claims every due sequence of a batch at once, then reports them at once: a sweeper that
   * awaited one record's publish confirm before claiming the next fell behind a flood of due
   * sequences, and one whose keys outlived their TTL meanwhile vanished unreported.
   */
  protected async sweepOnce(now: number): Promise<number> {
    let expiredCount = 0;
    for (;;) {
      const { batchSize } = this.settings;
      const due = await this.store.listExpired(now, batchSize);
      // allSettled: a claim that failed must not cost the others their report (a claimed
      // sequence is no longer due, so no later sweep would report it).
      const outcomes = await Promise.allSettled(due.map((ref) => this.claim(ref, now)));
      const claimed: ExpiredSequence[] = [];
      let failed = 0;
      for (const outcome of outcomes) {
        if (outcome.status === 'rejected') {
          failed++;
          this.logFailure(outcome.reason);
        } else if (outcome.value) {
          claimed.push(outcome.value);
        }
      }
      await Promise.all(claimed.map((expired) => this.report(expired)));
      expiredCount += claimed.length;
      if (failed > 0 || due.length < batchSize || claimed.length === 0) return expiredCount;
      // Shutting down: what is left stays due (claimed sequences were all reported).
      if (this.stopping) return expiredCount;
    }
  }

  /**
   * Claims `ref`'s expiry, waiting `tuning.storeTimeoutMs` at most, as for every store step. A
   * claim that answers later is reported then (the store expired the sequence, and no later
   * sweep would list it again); the shutdown waits for such reports, as for a sweep's.
   */
  private claim(ref: SequenceRef, now: number): Promise<ExpiredSequence | null> {
    const { storeTimeoutMs } = this.options.tuning;
    const claiming = this.unbounded.expire(ref, now, this.options.sequence.retentionMs);
    const subject = refSubject(ref);
    const bounded = storeStepWithin(
      this.unbounded.name,
      'expire',
      subject,
      storeTimeoutMs,
      claiming,
    );
    bounded.catch((error: unknown) => {
      if (!(error instanceof SequenceStoreTimeoutError)) return;
      const late = claiming.then(
        async (expired) => {
          if (!expired) return;
          this.logger.warn(
            `${ref.scope}: the expiry of sequence ${ref.sequenceId} answered after ` +
              `storeTimeoutMs (${storeTimeoutMs} ms); reported now`,
          );
          await this.report(expired);
        },
        () => undefined,
      );
      const tracked = late.catch((failure: unknown) => this.logFailure(failure));
      this.lateReports.add(tracked);
      void tracked.finally(() => this.lateReports.delete(tracked));
    });
    return bounded;
  }

  /** And the late reports of claims (see claim), for as long as a sweep's are waited for. */
  override async stop(): Promise<void> {
    await super.stop();
    if (!(await settlesWithin(Promise.all([...this.lateReports]), this.stopWaitMs()))) {
      this.leftRunning();
    }
  }

  private async report(expired: ExpiredSequence): Promise<void> {
    const channel = expired.scope;
    this.metrics.sequenceExpired(channel);
    this.lifecycle.expired(channel, expired);
    const detail =
      `sequence ${expired.sequenceId} expired after ${expired.ageMs} ms with ` +
      `${expired.receivedPositions.length} fragment(s) received, ` +
      `missing ${expired.size === undefined ? 'at least ' : ''}${formatPositions(expired.missingPositions)}`;
    this.logger.warn(`${channel}: ${detail}`);
    // Both awaits are bounded: a hook or a transport that never settles would otherwise hold
    // this sweep, every later one (they join it), and the application's shutdown.
    const hookMs = this.hookMs();
    try {
      const hook = this.options.sequence.onExpired;
      if (hook) {
        await withTimeout(
          Promise.resolve().then(() => hook(expired)),
          hookMs,
          () => new Error(`it did not settle within ${hookMs} ms; not awaited`),
        );
      }
    } catch (error) {
      this.logger.error(
        `onExpired hook failed for sequence ${expired.sequenceId}: ${errorMessage(error)}`,
      );
    }
    // A reply channel has no dead-letter channel (see Transport.openReplyChannel): its expired
    // reply goes, as its dead letters do, with the warning above; its caller times out.
    if (this.transport.isReplyChannel?.(channel) === true) return;
    const deadLetterChannel = this.aggregator.deadLetterChannelOf(channel);
    const record = Buffer.from(JSON.stringify(expiryRecord(channel, expired)));
    // Retried per `publish.retry`: the sequence is already claimed, so no later sweep would
    // report it. Shutting down ends the retries, not the first attempt (see leftRunning).
    let asked = 0;
    const outcome = await publishWithRetry(
      this.transport,
      deadLetterChannel,
      record,
      {
        [SequenceHeader.deathReason]: deathReason('sequence-expired', detail),
        [SequenceHeader.id]: expired.sequenceId,
        [SequenceHeader.contentType]: 'application/json',
      },
      this.options.publish,
      () => asked++ === 0 || !this.stopping,
    );
    if (outcome.ok) {
      this.deadLetters.deadLettered(channel, 'sequence-expired');
      return;
    }
    this.logger.error(
      `could not publish the expiry record of sequence ${expired.sequenceId} to ` +
        `${deadLetterChannel} (${outcome.attempts} attempt(s)): ${errorMessage(outcome.error)}`,
    );
  }

  private logFailure(error: unknown): void {
    this.logger.warn(`expiry sweep failed; will retry next interval: ${errorMessage(error)}`);
  }
}

/** `3, 5-9, 12` — compact, and capped so a huge gap does not make a huge log line. */
function formatPositions(positions: readonly number[]): string {
  if (positions.length === 0) return 'none';
  const ranges: string[] = [];
  let start = positions[0];
  let previous = start;
  for (const position of [...positions.slice(1), Number.NaN]) {
    if (position === previous + 1) {
      previous = position;
      continue;
    }
    ranges.push(start === previous ? `${start}` : `${start}-${previous}`);
    start = previous = position;
  }
  return ranges.length > 20 ? `${ranges.slice(0, 20).join(', ')}, …` : ranges.join(', ');
}

/** Positions listed in an expiry record, per list; the counts say how many there were. */
export const MAX_LISTED_POSITIONS = 10_000;

/**
 * The dead-letter record of an expired sequence. Position lists are cut at
 * {@link MAX_LISTED_POSITIONS} (the first ones kept, `…Truncated: true`): a sequence that claimed a
 * position near `maxFragments` would otherwise list all the others as missing, past what a
 * message may carry, and the record would be lost.
 */
export function expiryRecord(channel: string, expired: ExpiredSequence): Record<string, unknown> {
  const { receivedPositions, missingPositions, ...rest } = expired;
  return {
    kind: 'sequence-expired',
    channel,
    ...rest,
    receivedPositions: receivedPositions.slice(0, MAX_LISTED_POSITIONS),
    missingPositions: missingPositions.slice(0, MAX_LISTED_POSITIONS),
    receivedCount: receivedPositions.length,
    missingCount: missingPositions.length,
    ...(receivedPositions.length > MAX_LISTED_POSITIONS
      ? { receivedPositionsTruncated: true }
      : {}),
    ...(missingPositions.length > MAX_LISTED_POSITIONS ? { missingPositionsTruncated: true } : {}),
  };
}
