import { Inject, Injectable, Logger, Optional } from '@nestjs/common';
import { SchedulerRegistry } from '@nestjs/schedule';
import { clockFrom, settlesWithin } from '../core/async';
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
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
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

  /** When the shutdown's waits for the drains end (set by the first). */
  private drainsDeadline: number | undefined;
  /** Whether the shutdown left drains running (said once). */
  private drainsLeft = false;

  /**
   * At shutdown, once the subscriptions are closed: the drains that go on after acking their
   * input (their settles, and events of the key that came meanwhile) end before the store's
   * connection closes, for up to `shutdownTimeoutMs`. One still running then (its handler slow
   * or hung) is left: what it has not settled stays in its key's hand-off list, delivered again
   * by the key's next drain.
   */
  async stopConsuming(): Promise<void> {
    await this.drainsSettled();
  }

  /** And the drains its last sweeps left going on (see `Resequencer.sweep`), the same way. */
  override async stop(): Promise<void> {
    await super.stop();
    await this.drainsSettled();
  }

  /**
   * Waits for the resequencers' drains; both waits of a shutdown together take up to
   * `shutdownTimeoutMs` from the first.
   */
  private async drainsSettled(): Promise<void> {
    const { shutdownTimeoutMs } = this.options;
    const deadline = (this.drainsDeadline ??= Date.now() + shutdownTimeoutMs);
    const drains = Promise.all(this.catalog.all().map(({ resequencer }) => resequencer.settled()));
    if (!(await settlesWithin(drains, deadline - Date.now())) && !this.drainsLeft) {
      this.drainsLeft = true;
      this.logger.warn(
        `resequencer drains still running after shutdownTimeoutMs (${shutdownTimeoutMs} ms); ` +
          'shutting down without them: what they have not settled is delivered again by the ' +
          "key's next drain",
      );
    }
  }

  /** A sweep's drains call handlers: waited for as deliveries are, up to `shutdownTimeoutMs`. */
  protected override stopWaitMs(): number {
    return this.options.shutdownTimeoutMs;
  }

  protected override leftRunning(): void {
    this.logger.warn(
      `the gap sweep in progress did not finish within shutdownTimeoutMs ` +
        `(${this.options.shutdownTimeoutMs} ms); shutting down without it: the gaps it had not ` +
        "resolved stay due for the next sweep, and what its drains had not settled stays in its key's " +
        'hand-off list',
    );
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
