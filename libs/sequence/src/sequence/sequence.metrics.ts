import { Inject, Injectable } from '@nestjs/common';
import type { Counter, Histogram } from 'prom-client';
import { oneAtATime, withTimeout } from '../core/async';
import { ModuleMetrics, STATS_TIMEOUT_MS } from '../kernel/module-metrics';
import { SEQUENCE_BUDGETS, SEQUENCE_STORE, type SequenceBudgets } from '../kernel/tokens';
import type { SequenceStore, SequenceStoreStats } from '../ports/sequence-store.port';

/**
 * prom-client metrics of Message Sequence. Counters are per instance; the gauges read the store's
 * stats when scraped, so with a shared store they describe the shared state.
 */
@Injectable()
export class SequenceMetrics {
  private readonly started: Counter<'channel'>;
  private readonly completed: Counter<'channel'>;
  private readonly expired: Counter<'channel'>;
  private readonly rejected: Counter<'channel' | 'reason'>;
  private readonly fragmentsRejected: Counter<'channel' | 'reason'>;
  private readonly duplicates: Counter<'channel'>;
  private readonly fragments: Counter<'channel'>;
  private readonly bytes: Counter<'channel'>;
  private readonly handlerFailures: Counter<'channel'>;
  private readonly backpressure: Counter<'channel' | 'limit'>;
  private readonly latency: Histogram<'channel'>;
  private readonly statsFailures: Counter;

  constructor(
    metrics: ModuleMetrics,
    @Inject(SEQUENCE_STORE) store: SequenceStore,
    @Inject(SEQUENCE_BUDGETS) budgets: SequenceBudgets,
  ) {
    const counter = metrics.counter.bind(metrics);
    this.started = counter('sequences_started_total', 'Sequences whose first fragment was stored', [
      'channel',
    ]);
    this.completed = counter('sequences_completed_total', 'Sequences delivered to their handler', [
      'channel',
    ]);
    this.expired = counter(
      'sequences_expired_total',
      'Incomplete sequences expired by the sweeper',
      ['channel'],
    );
    this.rejected = counter(
      'sequences_rejected_total',
      'Sequences rejected whole (limits, integrity, handler failure)',
      ['channel', 'reason'],
    );
    this.fragmentsRejected = counter('fragments_rejected_total', 'Fragments dead-lettered', [
      'channel',
      'reason',
    ]);
    this.duplicates = counter('duplicate_fragments_total', 'Fragments dropped as duplicates', [
      'channel',
    ]);
    this.fragments = counter('fragments_received_total', 'Fragments received', ['channel']);
    this.bytes = counter('bytes_received_total', 'Fragment body bytes received', ['channel']);
    this.handlerFailures = counter('handler_failures_total', 'Handler calls that threw', [
      'channel',
    ]);
    this.backpressure = counter(
      'backpressure_total',
      'Fragments requeued because a store-wide limit was reached',
      ['channel', 'limit'],
    );
    this.statsFailures = counter(
      'store_stats_failures_total',
      'Scrapes at which the store could not report its stats (gauges kept their last value)',
    );
    this.latency = metrics.histogram(
      'reassembly_latency_seconds',
      'From a sequence first fragment to its handler having succeeded',
      ['channel'],
      [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
    );

    let lastStats: Promise<SequenceStoreStats | undefined> | undefined;
    // The store call itself, until it settles: a scrape that timed out leaves it running, and the
    // next scrapes wait on it rather than pile more reads on a slow store.
    const read = oneAtATime(() => store.stats(Date.now()));
    // One store round trip per scrape, shared by the three gauges. When the store cannot answer
    // (or not within STATS_TIMEOUT_MS: a server that stopped answering), the gauges keep their
    // last value and the scrape still succeeds: the counters that show an outage must stay
    // readable during one. `store_stats_failures_total` counts those scrapes.
    const stats = () => {
      lastStats ??= withTimeout(
        read(),
        STATS_TIMEOUT_MS,
        () => new Error(`the store's stats took over ${STATS_TIMEOUT_MS} ms`),
      )
        .catch(() => {
          this.statsFailures.inc();
          return undefined;
        })
        .finally(() => setImmediate(() => (lastStats = undefined)));
      return lastStats;
    };
    metrics.gauge(
      'open_sequences',
      'Sequences with fragments buffered and not yet complete',
      [],
      async (gauge) => {
        const current = await stats();
        if (current) gauge.set(current.openSequences);
      },
    );
    metrics.gauge(
      'buffered_bytes',
      'Budget bytes held by stored fragments: bodies, kept headers, per-sequence and per-fragment overheads',
      [],
      async (gauge) => {
        const current = await stats();
        if (current) gauge.set(current.bufferedBytes);
      },
    );
    metrics.gauge(
      'reserved_bytes',
      'Budget bytes reserved beyond stored ones, for declared bytes still on their way',
      [],
      async (gauge) => {
        const current = await stats();
        if (current) gauge.set(current.reservedBytes ?? 0);
      },
    );
    // What buffered_bytes + reserved_bytes is measured against (the shipped buffer alert).
    metrics
      .gauge(
        'max_buffered_bytes',
        'The budget of buffered plus reserved bytes (sequence.maxBufferedBytes)',
      )
      .set(budgets.maxBufferedBytes);
    metrics.gauge(
      'oldest_open_age_seconds',
      'Age of the oldest open sequence',
      [],
      async (gauge) => {
        const current = await stats();
        if (!current) return;
        const { oldestOpenAt } = current;
        // Another instance's clock wrote oldestOpenAt: a little ahead of this one's, it is 0.
        gauge.set(oldestOpenAt === undefined ? 0 : Math.max(0, Date.now() - oldestOpenAt) / 1000);
      },
    );
  }

  fragmentReceived(channel: string, bytes: number): void {
    this.fragments.inc({ channel });
    this.bytes.inc({ channel }, bytes);
  }

  sequenceStarted(channel: string): void {
    this.started.inc({ channel });
  }

  /** `firstFragmentAt` undefined: not known here (a stream followed from another instance). */
  sequenceCompleted(channel: string, firstFragmentAt: number | undefined): void {
    this.completed.inc({ channel });
    if (firstFragmentAt === undefined) return;
    this.latency.observe({ channel }, Math.max(0, Date.now() - firstFragmentAt) / 1000);
  }

  sequenceExpired(channel: string): void {
    this.expired.inc({ channel });
  }

  sequenceRejected(channel: string, reason: string): void {
    this.rejected.inc({ channel, reason });
  }

  fragmentRejected(channel: string, reason: string): void {
    this.fragmentsRejected.inc({ channel, reason });
  }

  duplicateFragment(channel: string): void {
    this.duplicates.inc({ channel });
  }

  handlerFailed(channel: string): void {
    this.handlerFailures.inc({ channel });
  }

  backpressured(channel: string, limit: string): void {
    this.backpressure.inc({ channel, limit });
  }
}
