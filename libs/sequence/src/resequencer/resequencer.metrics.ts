import { Inject, Injectable } from '@nestjs/common';
import type { Counter, Gauge } from 'prom-client';
import type { AcceptOutcome, GapStats, ResequencerStore } from '../ports/resequencer-store.port';
import { DeadLetterMetrics } from '../kernel/dead-letter.metrics';
import { ModuleMetrics, STATS_TIMEOUT_MS } from '../kernel/module-metrics';
import { RESEQUENCER_STORE } from '../kernel/tokens';
import { oneAtATime, withTimeout } from '../core/async';
import { ResequencerCatalog } from './resequencer.catalog';

/** What became of an input event: the store's answer, or a refusal before it. */
export type ResequencerIntake = AcceptOutcome['kind'] | 'invalid';

/**
 * prom-client metrics of the Resequencer, in the same registry and with the same prefix as the
 * rest. The open-gap gauges are read from the store when scraped (they describe the shared state,
 * so every instance reports the same values).
 */
@Injectable()
export class ResequencerMetrics {
  private readonly events: Counter<'resequencer' | 'outcome'>;
  private readonly deliveries: Counter<'resequencer'>;
  private readonly deadLetters: Counter<'resequencer' | 'reason'>;
  private readonly gaps: Counter<'resequencer' | 'type'>;
  private readonly handlerFailures: Counter<'resequencer'>;
  private readonly orderAtRisk: Counter<'resequencer'>;
  private readonly buffered: Gauge<'resequencer'>;
  private readonly bufferedBytes: Gauge<'resequencer'>;
  private readonly statsFailures: Counter<'resequencer'>;

  /** Each resequencer's gap statistics, one store read at a time (see {@link gapSnapshot}). */
  private readonly gapReaders = new Map<string, () => Promise<GapStats>>();
  private lastGapSnapshot: { at: number; stats: Promise<Map<string, GapStats>> } | undefined;

  constructor(
    metrics: ModuleMetrics,
    private readonly catalog: ResequencerCatalog,
    @Inject(RESEQUENCER_STORE) private readonly store: ResequencerStore,
    private readonly sentDeadLetters: DeadLetterMetrics,
  ) {
    const counter = metrics.counter.bind(metrics);
    const gauge = metrics.gauge.bind(metrics);

    this.events = counter(
      'resequencer_events_total',
      'Input events by outcome: released, buffered, duplicate, late, full, invalid',
      ['resequencer', 'outcome'],
    );
    this.deliveries = counter(
      'resequencer_delivered_total',
      'Events delivered in order (handler returned, or output publish confirmed)',
      ['resequencer'],
    );
    this.deadLetters = counter(
      'resequencer_dead_lettered_total',
      'Events and records put on the dead-letter channel, by reason',
      ['resequencer', 'reason'],
    );
    this.gaps = counter('resequencer_gaps_total', 'Gap outcomes: alert, skipped, dead-lettered', [
      'resequencer',
      'type',
    ]);
    this.handlerFailures = counter(
      'resequencer_handler_failures_total',
      'Handler calls that threw',
      ['resequencer'],
    );
    this.orderAtRisk = counter(
      'resequencer_output_order_at_risk_total',
      'Output publishes that failed while later ones of their key were confirmed ' +
        '(outputInFlight above 1): the output may hold those later ones first',
      ['resequencer'],
    );
    this.buffered = gauge(
      'resequencer_buffered',
      'Events buffered behind gaps, as last seen by this instance',
      ['resequencer'],
    );
    this.bufferedBytes = gauge(
      'resequencer_buffered_bytes',
      'Bytes of the events buffered behind gaps (body, headers and 64 bytes each), as last seen ' +
        'by this instance',
      ['resequencer'],
    );

    this.statsFailures = counter(
      'resequencer_stats_failures_total',
      "Scrapes at which the store could not report a resequencer's gap stats (its gauges kept " +
        'their last value)',
      ['resequencer'],
      // Every resequencer's from 0, so that a rate over its first failure sees it.
      (failures) => {
        for (const { resequencer } of catalog.all())
          failures.inc({ resequencer: resequencer.name }, 0);
      },
    );
    const openGaps: Gauge<'resequencer'> = gauge(
      'resequencer_open_gaps',
      'Keys waiting on a gap (alerted or not), per resequencer',
      ['resequencer'],
      async () => {
        for (const [resequencer, stats] of await this.gapSnapshot()) {
          openGaps.set({ resequencer }, stats.openGaps);
        }
      },
    );
    const oldestGap: Gauge<'resequencer'> = gauge(
      'resequencer_oldest_gap_age_seconds',
      'How long the oldest open gap has waited, per resequencer (0 when none)',
      ['resequencer'],
      async () => {
        for (const [resequencer, stats] of await this.gapSnapshot()) {
          oldestGap.set({ resequencer }, (stats.oldestGapAgeMs ?? 0) / 1000);
        }
      },
    );
  }

  received(resequencer: string, outcome: ResequencerIntake): void {
    this.events.inc({ resequencer, outcome });
  }

  delivered(resequencer: string, count = 1): void {
    this.deliveries.inc({ resequencer }, count);
  }

  deadLettered(resequencer: string, reason: string): void {
    this.deadLetters.inc({ resequencer, reason });
  }

  /**
   * A dead letter or gap record the resequencer published itself, to the dead-letter channel of
   * `channel` (its input), confirmed: for the module-wide `dead_letters_total`.
   */
  deadLetterSent(channel: string, reason: string): void {
    this.sentDeadLetters.deadLettered(channel, reason);
  }

  gap(resequencer: string, type: 'alert' | 'skipped' | 'dead-lettered'): void {
    this.gaps.inc({ resequencer, type });
  }

  handlerFailed(resequencer: string): void {
    this.handlerFailures.inc({ resequencer });
  }

  outputOrderAtRisk(resequencer: string, count = 1): void {
    this.orderAtRisk.inc({ resequencer }, count);
  }

  bufferedNow(resequencer: string, count: number, bytes: number): void {
    this.buffered.set({ resequencer }, count);
    this.bufferedBytes.set({ resequencer }, bytes);
  }

  /**
   * Every resequencer's gap statistics, read once for both gauges of one scrape (a second read
   * within a second shares the first). Each read has STATS_TIMEOUT_MS: a store that stopped
   * answering must not hold the scrape. A resequencer whose read failed is left out, and its
   * gauges keep their last value (the health check says why).
   */
  private gapSnapshot(): Promise<Map<string, GapStats>> {
    const now = Date.now();
    if (this.lastGapSnapshot && now - this.lastGapSnapshot.at < 1_000) {
      return this.lastGapSnapshot.stats;
    }
    const stats = (async () => {
      const read = new Map<string, GapStats>();
      await Promise.all(
        this.catalog.all().map(async ({ resequencer: { name } }) => {
          let reader = this.gapReaders.get(name);
          if (!reader) {
            reader = oneAtATime(() => this.store.gapStats(name, Date.now()));
            this.gapReaders.set(name, reader);
          }
          try {
            const each = await withTimeout(
              reader(),
              STATS_TIMEOUT_MS,
              () => new Error(`the gap stats of ${name} took over ${STATS_TIMEOUT_MS} ms`),
            );
            read.set(name, each);
          } catch {
            // unreachable or slow store: see above; counted, as its frozen gauges alert on nothing
            this.statsFailures.inc({ resequencer: name });
          }
        }),
      );
      return read;
    })();
    this.lastGapSnapshot = { at: now, stats };
    return stats;
  }
}
