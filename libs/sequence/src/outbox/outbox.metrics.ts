import { Injectable } from '@nestjs/common';
import type { Counter, Gauge, Histogram } from 'prom-client';
import { BOX_NAMES, type BoxName, type BoxStats } from '../ports/outbox-store.port';
import { ModuleMetrics, STATS_TIMEOUT_MS } from '../kernel/module-metrics';
import { oneAtATime, withTimeout } from '../core/async';

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
  private readonly statsFailures: Counter<'box'>;
  /**
   * Each box's statistics, read from the source `readStatsFrom` gave, one read at a time: a scrape
   * that timed out leaves its read running, and the next waits on it.
   */
  private readers = new Map<BoxName, () => Promise<BoxStats>>();

  constructor(metrics: ModuleMetrics) {
    const counter = metrics.counter.bind(metrics);
    const gauge = metrics.gauge.bind(metrics);
    const histogram = metrics.histogram.bind(metrics);
    this.published = counter(
      'outbox_published_total',
      'Outbox records published with a confirm (every route of the record)',
      ['box'],
    );
    this.attemptsFailed = counter(
      'outbox_attempts_failed_total',
      'Publish (outbox) or handler (inbox) attempts that failed, by what followed: retry or failed',
      ['box', 'outcome'],
    );
    this.received = counter(
      'inbox_received_total',
      'Messages an inbox received, by outcome: added, duplicate, invalid',
      ['box', 'outcome'],
    );
    this.processed = counter('inbox_processed_total', 'Inbox records whose handler completed', [
      'box',
    ]);
    this.latency = histogram(
      'outbox_latency_seconds',
      'From append (commit) to publish confirmed (outbox) or handler done (inbox)',
      ['box'],
      [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
    );
    this.statsFailures = counter(
      'outbox_stats_failures_total',
      'Scrapes at which a box could not report its stats (its gauges kept their last value)',
      ['box'],
    );
    const boxGauge = (name: string, help: string, read: (stats: BoxStats) => number): void => {
      const made: Gauge<'box'> = gauge(name, help, ['box'], async () => {
        for (const [box, stats] of await this.snapshot()) made.set({ box }, read(stats));
      });
    };
    boxGauge('outbox_pending', 'PENDING records per box', (s) => s.pending);
    boxGauge('outbox_failed', 'FAILED records per box', (s) => s.failed);
    boxGauge(
      'outbox_oldest_pending_age_seconds',
      'Age of the oldest PENDING record per box (0 when none)',
      (s) => (s.oldestPendingAt === null ? 0 : Math.max(0, Date.now() - s.oldestPendingAt) / 1000),
    );
  }

  /** Where the gauges read box statistics from (the runtime, once the store is open). */
  readStatsFrom(source: ((box: BoxName) => Promise<BoxStats>) | undefined): void {
    this.readers = new Map(
      source ? BOX_NAMES.map((box) => [box, oneAtATime(() => source(box))] as const) : [],
    );
    // From 0, so that a rate over the first failure sees it.
    for (const box of this.readers.keys()) this.statsFailures.inc({ box }, 0);
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

  /**
   * Every box's statistics, read once for the three gauges of one scrape (a second read within
   * a second shares the first). A box whose read failed is left out: its gauges keep their last
   * value (the health check says why), and `outbox_stats_failures_total` counts it, since a frozen
   * age would keep the lag alert quiet through the outage.
   */
  private snapshot(): Promise<Map<BoxName, BoxStats>> {
    const now = Date.now();
    if (this.lastSnapshot && now - this.lastSnapshot.at < 1_000) return this.lastSnapshot.stats;
    const readers = this.readers;
    const stats = (async () => {
      const read = new Map<BoxName, BoxStats>();
      // The boxes at once, each within STATS_TIMEOUT_MS: a database that stopped answering must
      // not hold the scrape (a pool's connect and query timeouts are tens of seconds).
      await Promise.all(
        [...readers].map(async ([box, reader]) => {
          try {
            const each = await withTimeout(
              reader(),
              STATS_TIMEOUT_MS,
              () => new Error(`the ${box} stats took over ${STATS_TIMEOUT_MS} ms`),
            );
            read.set(box, each);
          } catch {
            // unreachable or slow store: see above
            this.statsFailures.inc({ box });
          }
        }),
      );
      return read;
    })();
    this.lastSnapshot = { at: now, stats };
    return stats;
  }

  private lastSnapshot: { at: number; stats: Promise<Map<BoxName, BoxStats>> } | undefined;
}
