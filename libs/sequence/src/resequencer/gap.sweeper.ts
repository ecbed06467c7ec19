import {
  Inject,
  Injectable,
  Logger,
  Optional,
  type BeforeApplicationShutdown,
  type OnApplicationBootstrap,
} from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { ResequencerRegistry } from '../discovery/resequencer.registry';
import { IntervalJob } from '../scheduling/interval-job';
import { clockFrom } from '../core/async';
import { errorMessage } from '../core/errors/caught';
import { RESEQUENCER_OPTIONS } from './resequencer.constants';
import type { ResolvedResequencerModuleOptions } from './resequencer.options';

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
export class GapSweeper implements OnApplicationBootstrap, BeforeApplicationShutdown {
  private readonly logger = new Logger('Resequencer');
  /** Its `stopping`, set at shutdown, stops a sweep in progress at the next key. */
  private readonly job: IntervalJob<GapSweepReport>;

  constructor(
    @Inject(RESEQUENCER_OPTIONS) private readonly options: ResolvedResequencerModuleOptions,
    private readonly registry: ResequencerRegistry,
    @Optional() schedulerRegistry?: SchedulerRegistry,
  ) {
    this.job = new IntervalJob(GAP_SWEEPER_INTERVAL, schedulerRegistry, () =>
      this.sweepAll(Date.now()),
    );
  }

  onApplicationBootstrap(): void {
    this.job.start(this.options.sweepIntervalMs, (error) =>
      this.logger.warn(`gap sweep failed; will retry next interval: ${errorMessage(error)}`),
    );
  }

  async beforeApplicationShutdown(): Promise<void> {
    await this.job.stop();
  }

  /** Runs one sweep now. Overlapping calls share one run. */
  sweep(now: number = Date.now()): Promise<GapSweepReport> {
    return this.job.run(() => this.sweepAll(now));
  }

  private async sweepAll(now: number): Promise<GapSweepReport> {
    const totals = { gapsResolved: 0, stalledDrained: 0 };
    // One clock for the whole sweep, moving on while it goes from one resequencer to the next.
    const clock = clockFrom(now);
    for (const { resequencer } of this.registry.all()) {
      try {
        if (this.job.stopping) break;
        const report = await resequencer.sweep(clock(), () => this.job.stopping);
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
