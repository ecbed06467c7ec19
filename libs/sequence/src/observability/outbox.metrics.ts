import { Inject, Injectable } from '@nestjs/common';
import { Counter, Gauge, Histogram } from 'prom-client';
import { BOX_NAMES, type BoxName, type BoxStats } from '../ports/outbox-store.port';
import { SEQUENCE_OPTIONS } from '../sequence.constants';
import { SEQUENCE_DEFAULTS, type ResolvedSequenceOptions } from '../sequence.options';
import { SequenceMetrics } from './sequence.metrics';

/** What an inbox did with a received message. */
export type InboxIntake = 'added' | 'duplicate' | 'invalid';

/**
 * prom-client metrics of the Outbox / Inbox, per box, in the module's registry. The pending,
 * failed and oldest-pending gauges are read from the store when scraped (they describe the shared
 * tables, so every instance reports the same values).
 */
@Injectable()
export class OutboxMetrics {
  private readonly published: Counter<'box'>;
  private readonly attemptsFailed: Counter<'box' | 'outcome'>;
  private readonly received: Counter<'box' | 'outcome'>;
  private readonly processed: Counter<'box'>;
  private readonly latency: Histogram<'box'>;
  private statsSource: ((box: BoxName) => Promise<BoxStats>) | undefined;

  constructor(
    @Inject(SEQUENCE_OPTIONS) options: ResolvedSequenceOptions,
    sequenceMetrics: SequenceMetrics,
  ) {
    const prefix =
      options.metrics === false ? SEQUENCE_DEFAULTS.metricsPrefix : options.metrics.prefix;
    const registers = options.metrics === false ? [] : [sequenceMetrics.registry];
    this.published = new Counter({
      name: `${prefix}outbox_published_total`,
      help: 'Outbox records published with a confirm (every route of the record)',
      labelNames: ['box'],
      registers,
    });
    this.attemptsFailed = new Counter({
      name: `${prefix}outbox_attempts_failed_total`,
      help: 'Publish (outbox) or handler (inbox) attempts that failed, by what followed: retry or failed',
      labelNames: ['box', 'outcome'],
      registers,
    });
    this.received = new Counter({
      name: `${prefix}inbox_received_total`,
      help: 'Messages an inbox received, by outcome: added, duplicate, invalid',
      labelNames: ['box', 'outcome'],
      registers,
    });
    this.processed = new Counter({
      name: `${prefix}inbox_processed_total`,
      help: 'Inbox records whose handler completed',
      labelNames: ['box'],
      registers,
    });
    this.latency = new Histogram({
      name: `${prefix}outbox_latency_seconds`,
      help: 'From append (commit) to publish confirmed (outbox) or handler done (inbox)',
      labelNames: ['box'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
      registers,
    });
    const gauge = (name: string, help: string, read: (stats: BoxStats) => number) =>
      new Gauge({
        name: `${prefix}${name}`,
        help,
        labelNames: ['box'],
        registers,
        collect: async () => this.collect(name, read),
      });
    this.pendingGauge = gauge('outbox_pending', 'PENDING records per box', (s) => s.pending);
    this.failedGauge = gauge('outbox_failed', 'FAILED records per box', (s) => s.failed);
    this.ageGauge = gauge(
      'outbox_oldest_pending_age_seconds',
      'Age of the oldest PENDING record per box (0 when none)',
      (s) => (s.oldestPendingAt === null ? 0 : Math.max(0, Date.now() - s.oldestPendingAt) / 1000),
    );
  }

  private readonly pendingGauge: Gauge<'box'>;
  private readonly failedGauge: Gauge<'box'>;
  private readonly ageGauge: Gauge<'box'>;

  /** Where the gauges read box statistics from (the runtime, once the store is open). */
  readStatsFrom(source: ((box: BoxName) => Promise<BoxStats>) | undefined): void {
    this.statsSource = source;
    this.lastSnapshot = undefined;
  }

  publishedOne(box: BoxName, createdAt: number): void {
    this.published.inc({ box });
    this.latency.observe({ box }, Math.max(0, Date.now() - createdAt) / 1000);
  }

  attemptFailed(box: BoxName, outcome: 'retry' | 'failed'): void {
    this.attemptsFailed.inc({ box, outcome });
  }

  receivedOne(box: BoxName, outcome: InboxIntake): void {
    this.received.inc({ box, outcome });
  }

  processedOne(box: BoxName, createdAt: number): void {
    this.processed.inc({ box });
    this.latency.observe({ box }, Math.max(0, Date.now() - createdAt) / 1000);
  }

  private async collect(name: string, read: (stats: BoxStats) => number): Promise<void> {
    const gauge = {
      outbox_pending: this.pendingGauge,
      outbox_failed: this.failedGauge,
      outbox_oldest_pending_age_seconds: this.ageGauge,
    }[name];
    if (!gauge) return;
    for (const [box, stats] of await this.snapshot()) gauge.set({ box }, read(stats));
  }

  /**
   * Every box's statistics, read once for the three gauges of one scrape (a second read within
   * a second shares the first). A box whose read failed is left out: its gauges keep their last
   * value (the health check says why).
   */
  private snapshot(): Promise<Map<BoxName, BoxStats>> {
    const now = Date.now();
    if (this.lastSnapshot && now - this.lastSnapshot.at < 1_000) return this.lastSnapshot.stats;
    const source = this.statsSource;
    const stats = (async () => {
      const read = new Map<BoxName, BoxStats>();
      if (!source) return read;
      for (const box of BOX_NAMES) {
        try {
          read.set(box, await source(box));
        } catch {
          // unreachable store: see above
        }
      }
      return read;
    })();
    this.lastSnapshot = { at: now, stats };
    return stats;
  }

  private lastSnapshot: { at: number; stats: Promise<Map<BoxName, BoxStats>> } | undefined;
}
