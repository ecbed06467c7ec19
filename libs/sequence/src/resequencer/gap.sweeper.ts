import { Inject, Injectable, Logger, Optional } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { clockFrom } from '../core/async';
import { errorMessage } from '../core/errors/caught';
import { Sweeper } from '../kernel/sweeper';
import { RESOLVED_OPTIONS } from '../kernel/tokens';
import type { ResolvedOptions } from '../options/resolved-options';
import { ResequencerCatalog } from './resequencer.catalog';

export const GAP_SWEEPER_INTERVAL = 'nest-sequence:gap-sweeper';

/** What one sweep did, over every resequencer of the application. */
export interface GapSweepReport {
  readonly gapsResolved: number;
  readonly stalledDrained: number;
}

/**
 * Applies each resequencer's gap policy to gaps open longer than `gap.timeoutMs`, and drains
 * hand-off lists nobody is draining (their drainer died). Safe on every instance at once: the
 * store resolves each gap once, and a key's hand-off has one drainer at a time.
 */
@Injectable()
export class GapSweeper extends Sweeper<GapSweepReport> {
  protected readonly what = 'gap sweep';

  constructor(
    @Inject(RESOLVED_OPTIONS) options: ResolvedOptions,
    private readonly catalog: ResequencerCatalog,
    @Optional() schedulerRegistry?: SchedulerRegistry,
  ) {
    super(
      GAP_SWEEPER_INTERVAL,
      options.tuning.sweepers.gaps,
      new Logger('Resequencer'),
      schedulerRegistry,
    );
  }

  /**
   * At shutdown, once the subscriptions are closed: the drains that go on after acking their
   * input (their settles) end before the store's connection closes.
   */
  async stopConsuming(): Promise<void> {
    await Promise.all(this.catalog.all().map(({ resequencer }) => resequencer.settled()));
  }

  protected sweepOnce(now: number): Promise<GapSweepReport> {
    return this.sweepAll(now);
  }

  private async sweepAll(now: number): Promise<GapSweepReport> {
    const totals = { gapsResolved: 0, stalledDrained: 0 };
    // One clock for the whole sweep, moving on while it goes from one resequencer to the next.
    const clock = clockFrom(now);
    for (const { resequencer } of this.catalog.all()) {
      try {
        if (this.stopping) break;
        const report = await resequencer.sweep(clock(), () => this.stopping);
        totals.gapsResolved += report.gapsResolved;
        totals.stalledDrained += report.stalledDrained;
      } catch (error) {
        this.logger.warn(
          `could not sweep resequencer ${resequencer.name}; will retry next run: ${errorMessage(error)}`,
        );
      }
    }
    return totals;
  }
}
