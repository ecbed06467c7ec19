import { Inject, Injectable, Optional } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import type { ResequencerStore } from '../ports/resequencer-store.port';
import { RESEQUENCER_STORE, SWEEP_TIMING, type SweepTiming } from '../kernel/tokens';
import type { ResequencerBuffers, ResequencerGaps } from '../resequencer/resequencer';
import { ResequencerService } from '../resequencer/resequencer.service';
import { withTimeout } from '../core/async';
import {
  probe,
  sharedHealthCall,
  type SequenceDependencyHealth,
  type SequenceHealthCheckOptions,
} from './sequence-health.indicator';
import {
  HEALTH_OPTIONS,
  resolveHealthOptions,
  type ResolvedHealthOptions,
  resolveHealthCheck,
} from './health.options';
import { formatMs, HealthVerdict, RUNBOOKS, type HealthFindings } from './health-verdict';

// A type alias, not an interface: terminus takes the details as a `Record<string, unknown>`.
export type ResequencerHealthDetails = {
  readonly store: SequenceDependencyHealth;
  /**
   * Per resequencer, what its buffers hold against `maxBufferedTotal` and
   * `maxBufferedBytesTotal`; absent while the store is down.
   */
  readonly buffers?: Readonly<Record<string, ResequencerBuffers>>;
  /**
   * Per resequencer, the keys waiting on a gap (`openGaps`), the age of the oldest gap in ms
   * (absent when none is open) and its gap option; absent while the store is down.
   */
  readonly gaps?: Readonly<Record<string, ResequencerGaps>>;
} & HealthFindings;

/**
 * `@nestjs/terminus` health indicator of the Resequencer: pings its store (Redis, or the embedded
 * memory store) within a timeout, and reports per resequencer what its buffers hold against
 * their bounds (full buffers are back-pressure, not a failure) and its open gaps. Down when the
 * store does not answer, or when a threshold of `SequenceHealthModule.forRoot` is passed (by
 * default a gap open past its `gap.timeoutMs`): `tripped` names each with its value and limit.
 * While the store is down, input events are requeued, never acked.
 *
 * @example
 * ```ts
 * check() {
 *   return this.health.check([() => this.resequencer.isHealthy('resequencer')]);
 * }
 * // { "resequencer": { "status": "up", "store": { "name": "redis", "status": "up" },
 * //   "buffers": { "orders": { "events": 12, "maxEvents": 100000, "bytes": 20480,
 * //                            "maxBytes": 268435456 } },
 * //   "gaps": { "orders": { "openGaps": 1, "oldestGapAgeMs": 5200, "timeoutMs": 60000,
 * //                         "policy": "alert" } } } }
 * ```
 */
@Injectable()
export class ResequencerHealthIndicator {
  /** The figures, each shared with a read still running from an earlier probe. */
  private readonly readBuffers = sharedHealthCall(() => this.resequencers.buffers());
  private readonly readGaps = sharedHealthCall(() => this.resequencers.gapStats());

  private readonly thresholds: ResolvedHealthOptions;

  constructor(
    private readonly health: HealthIndicatorService,
    @Inject(RESEQUENCER_STORE) private readonly store: ResequencerStore,
    private readonly resequencers: ResequencerService,
    @Inject(SWEEP_TIMING) private readonly timing: SweepTiming,
    @Optional() @Inject(HEALTH_OPTIONS) thresholds?: ResolvedHealthOptions,
  ) {
    this.thresholds = thresholds ?? resolveHealthOptions();
  }

  async isHealthy<const Key extends string>(
    key: Key,
    options: SequenceHealthCheckOptions = {},
  ): Promise<HealthIndicatorResult<Key, 'up' | 'down', ResequencerHealthDetails>> {
    const { timeoutMs, thresholds } = resolveHealthCheck(
      'ResequencerHealthIndicator.isHealthy',
      options,
    );
    const store = await probe(this.store, timeoutMs);
    const indicator = this.health.check(key);
    if (store.status === 'down') return indicator.down({ store });
    // The figures are details: reading them slowly or failing must neither hold the probe past
    // its timeout nor turn a store that answered into a failed check.
    const [buffers, gaps] = await Promise.all([
      withTimeout(
        this.readBuffers(),
        timeoutMs,
        () => new Error('the buffered totals took too long'),
      ).catch(() => undefined),
      withTimeout(this.readGaps(), timeoutMs, () => new Error('the gap stats took too long')).catch(
        () => undefined,
      ),
    ]);
    const verdict = new HealthVerdict(this.thresholds.warnRatio);
    if (thresholds) {
      for (const [name, each] of Object.entries(gaps ?? {})) this.judge(name, each, verdict);
    }
    const details: ResequencerHealthDetails = {
      store,
      ...(buffers && { buffers }),
      ...(gaps && { gaps }),
      ...verdict.findings(),
    };
    return verdict.down ? indicator.down(details) : indicator.up(details);
  }

  private judge(name: string, gaps: ResequencerGaps, verdict: HealthVerdict): void {
    const { oldestGapAgeMs, openGaps } = this.thresholds.resequencer;
    const { gapSweepMs } = this.timing;
    if (gaps.oldestGapAgeMs !== undefined) {
      verdict.judge({
        threshold: 'resequencer.oldestGapAgeMs',
        subject: name,
        value: gaps.oldestGapAgeMs,
        limit:
          oldestGapAgeMs === 'timeout'
            ? gaps.timeoutMs + (gapSweepMs === false ? 0 : gapSweepMs)
            : oldestGapAgeMs,
        runbook: RUNBOOKS.openGap,
        describe: (value, limit) =>
          `resequencer ${name}: oldest gap open ${formatMs(value)}, limit ${formatMs(limit)}` +
          (oldestGapAgeMs === 'timeout' ? ` (gap.timeoutMs and one gap sweep)` : ''),
      });
    }
    verdict.judge({
      threshold: 'resequencer.openGaps',
      subject: name,
      value: gaps.openGaps,
      limit: openGaps,
      runbook: RUNBOOKS.openGap,
      describe: (value, limit) =>
        `resequencer ${name}: ${value} keys waiting on a gap, limit ${limit}`,
    });
  }
}
