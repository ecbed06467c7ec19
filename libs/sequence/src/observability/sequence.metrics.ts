import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { SEQUENCE_OPTIONS, SEQUENCE_STORE } from '../sequence.constants';
import { SEQUENCE_DEFAULTS, type ResolvedSequenceOptions } from '../sequence.options';
import type { SequenceStore, SequenceStoreStats } from '../ports/sequence-store.port';
import { oneAtATime, withTimeout } from '../core/async';

/**
 * prom-client metrics of Message Sequence. Counters are per instance; the gauges read the store's
 * stats when scraped, so with a shared store they describe the shared state.
 */
/** How long a scrape waits for a store's statistics before the gauges keep their last value. */
export const STATS_TIMEOUT_MS = 1_000;

@Injectable()
export class SequenceMetrics implements OnApplicationShutdown {
  /** The registry holding these metrics (the one passed in options, or the module's own). */
  readonly registry: Registry;
  /** Names of the module's metrics in that registry (its own and the other patterns'). */
  private readonly names = new Set<string>();
  /** Whether `registry` is the module's own (not one the application passed in). */
  private readonly ownRegistry: boolean;
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
    @Inject(SEQUENCE_OPTIONS) options: ResolvedSequenceOptions,
    @Inject(SEQUENCE_STORE) store: SequenceStore,
  ) {
    const prefix =
      options.metrics === false ? SEQUENCE_DEFAULTS.metricsPrefix : options.metrics.prefix;
    const given = options.metrics === false ? undefined : options.metrics.registry;
    this.ownRegistry = given === undefined;
    this.registry = given ?? new Registry();
    const registers = options.metrics === false ? [] : [this.registry];
    const counter = <L extends string>(name: string, help: string, labelNames: L[]) =>
      new Counter<L>({ name: this.adopt(prefix + name), help, labelNames, registers });

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
    this.statsFailures = new Counter({
      name: this.adopt(prefix + 'store_stats_failures_total'),
      help: 'Scrapes at which the store could not report its stats (gauges kept their last value)',
      registers,
    });
    this.latency = new Histogram({
      name: this.adopt(prefix + 'reassembly_latency_seconds'),
      help: 'From a sequence first fragment to its handler having succeeded',
      labelNames: ['channel'],
      buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
      registers,
    });

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
    new Gauge({
      name: this.adopt(prefix + 'open_sequences'),
      help: 'Sequences with fragments buffered and not yet complete',
      registers,
      async collect() {
        const current = await stats();
        if (current) this.set(current.openSequences);
      },
    });
    new Gauge({
      name: this.adopt(prefix + 'buffered_bytes'),
      help: 'Fragment bytes held by the store',
      registers,
      async collect() {
        const current = await stats();
        if (current) this.set(current.bufferedBytes);
      },
    });
    new Gauge({
      name: this.adopt(prefix + 'oldest_open_age_seconds'),
      help: 'Age of the oldest open sequence',
      registers,
      async collect() {
        const current = await stats();
        if (!current) return;
        const { oldestOpenAt } = current;
        // Another instance's clock wrote oldestOpenAt: a little ahead of this one's, it is 0.
        this.set(oldestOpenAt === undefined ? 0 : Math.max(0, Date.now() - oldestOpenAt) / 1000);
      },
    });
  }

  /** Records `name` as one of the module's metrics (see {@link onApplicationShutdown}). */
  adopt(name: string): string {
    this.names.add(name);
    return name;
  }

  /**
   * Takes the module's metrics out of a registry the application passed in (say prom-client's
   * global one): the next application in the process (a test suite's next test) can then
   * register them again, and scrapes no longer call this one's closed store. The module's own
   * registry keeps them, with their final values.
   */
  onApplicationShutdown(): void {
    if (this.ownRegistry) return;
    for (const name of this.names) this.registry.removeSingleMetric(name);
    this.names.clear();
  }

  fragmentReceived(channel: string, bytes: number): void {
    this.fragments.inc({ channel });
    this.bytes.inc({ channel }, bytes);
  }

  sequenceStarted(channel: string): void {
    this.started.inc({ channel });
  }

  sequenceCompleted(channel: string, firstFragmentAt: number): void {
    this.completed.inc({ channel });
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
