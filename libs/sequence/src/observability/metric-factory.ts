import { Counter, Gauge, Histogram } from 'prom-client';
import { SEQUENCE_DEFAULTS, type ResolvedSequenceOptions } from '../sequence.options';
import type { SequenceMetrics } from './sequence.metrics';

/**
 * Makes the module's metrics: its prefix, in its registry (or in none when metrics are off),
 * removed from it at shutdown with Message Sequence's.
 */
export interface MetricFactory {
  counter<L extends string>(name: string, help: string, labelNames: L[]): Counter<L>;
  /** With `collect`: refreshed by it at every scrape (a gauge of shared state read from a store). */
  gauge<L extends string>(
    name: string,
    help: string,
    labelNames: L[],
    collect?: () => Promise<void>,
  ): Gauge<L>;
  histogram<L extends string>(
    name: string,
    help: string,
    labelNames: L[],
    buckets: number[],
  ): Histogram<L>;
}

export function metricFactory(
  options: ResolvedSequenceOptions,
  sequenceMetrics: SequenceMetrics,
): MetricFactory {
  const prefix =
    options.metrics === false ? SEQUENCE_DEFAULTS.metricsPrefix : options.metrics.prefix;
  // Metrics off: still counted (callers need not care), registered nowhere.
  const registers = options.metrics === false ? [] : [sequenceMetrics.registry];
  const named = (name: string) => sequenceMetrics.adopt(prefix + name);
  return {
    counter: (name, help, labelNames) =>
      new Counter({ name: named(name), help, labelNames, registers }),
    gauge: (name, help, labelNames, collect) =>
      new Gauge({ name: named(name), help, labelNames, registers, collect }),
    histogram: (name, help, labelNames, buckets) =>
      new Histogram({ name: named(name), help, labelNames, buckets, registers }),
  };
}
