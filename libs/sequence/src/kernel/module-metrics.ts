import { Inject, Injectable } from '@nestjs/common';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { DEFAULTS } from '../options/defaults';
import type { ResolvedOptions } from '../options/resolved-options';
import type { LifecyclePart } from './sequence.lifecycle';
import { RESOLVED_OPTIONS } from './tokens';

/** How long a scrape waits for a store's statistics before the gauges keep their last value. */
export const STATS_TIMEOUT_MS = 1_000;

/**
 * The module's prom-client metrics as a whole: the registry they live in (the application's, or
 * one of the module's own), their name prefix, and the factory every pattern's metrics are made
 * with. With `metrics: false` they are still counted, and registered nowhere.
 */
@Injectable()
export class ModuleMetrics implements LifecyclePart {
  /** The registry holding the metrics (the one passed in options, or the module's own). */
  readonly registry: Registry;
  private readonly prefix: string;
  private readonly registers: Registry[];
  /** Whether `registry` is the module's own (not one the application passed in). */
  private readonly ownRegistry: boolean;
  /** Names of the module's metrics in that registry. */
  private readonly names = new Set<string>();

  constructor(@Inject(RESOLVED_OPTIONS) { metrics }: Pick<ResolvedOptions, 'metrics'>) {
    this.prefix = metrics === false ? DEFAULTS.metricsPrefix : metrics.prefix;
    const given = metrics === false ? undefined : metrics.registry;
    this.ownRegistry = given === undefined;
    this.registry = given ?? new Registry();
    this.registers = metrics === false ? [] : [this.registry];
  }

  /** With `collect`: run at every scrape before the values are read (to start label sets at 0). */
  counter<L extends string>(
    name: string,
    help: string,
    labelNames: L[] = [],
    collect?: (counter: Counter<L>) => void,
  ): Counter<L> {
    return new Counter<L>({
      name: this.named(name),
      help,
      labelNames,
      registers: this.registers,
      collect: collect
        ? function (this: Counter<L>) {
            collect(this);
          }
        : undefined,
    });
  }

  /** With `collect`: refreshed by it at every scrape (a gauge of shared state read from a store). */
  gauge<L extends string>(
    name: string,
    help: string,
    labelNames: L[] = [],
    collect?: (gauge: Gauge<L>) => Promise<void>,
  ): Gauge<L> {
    return new Gauge<L>({
      name: this.named(name),
      help,
      labelNames,
      registers: this.registers,
      collect: collect
        ? async function (this: Gauge<L>) {
            await collect(this);
          }
        : undefined,
    });
  }

  histogram<L extends string>(
    name: string,
    help: string,
    labelNames: L[],
    buckets: number[],
  ): Histogram<L> {
    return new Histogram({
      name: this.named(name),
      help,
      labelNames,
      buckets,
      registers: this.registers,
    });
  }

  /**
   * Takes the module's metrics out of a registry the application passed in (say prom-client's
   * global one): the next application in the process (a test suite's next test) can then
   * register them again, and scrapes no longer call this one's closed store. The module's own
   * registry keeps them, with their final values. Last at shutdown, and when the module's own
   * start fails at bootstrap.
   */
  close(): Promise<void> {
    if (!this.ownRegistry) {
      for (const name of this.names) this.registry.removeSingleMetric(name);
      this.names.clear();
    }
    return Promise.resolve();
  }

  private named(name: string): string {
    const full = this.prefix + name;
    this.names.add(full);
    return full;
  }
}
