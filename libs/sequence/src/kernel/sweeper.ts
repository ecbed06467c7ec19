import type { Logger } from '@nestjs/common';
import type { SchedulerRegistry } from '@nestjs/schedule';
import { MAX_TIMER_MS } from '../core/async';
import { errorMessage } from '../core/errors/caught';
import type { ResolvedSweeper } from '../options/resolved-options';
import { IntervalJob } from './interval-job';

/**
 * The base of the module's periodic jobs (expiry, orphans, gaps, outbox purge): one run every
 * `intervalMs` (none on this instance when it is `false`), never two at once, a failed run
 * logged and tried again at the next interval, and a bounded wait for the run in progress at
 * shutdown. It joins the app's `SchedulerRegistry` when the app imports `ScheduleModule.forRoot()`
 * (see {@link IntervalJob}). {@link SequenceLifecycle} starts and stops it.
 */
export abstract class Sweeper<Report> {
  private readonly job: IntervalJob<Report>;

  constructor(
    /** Its name in the scheduler registry, e.g. `nest-sequence:expiry-sweeper`. */
    readonly jobName: string,
    protected readonly settings: ResolvedSweeper,
    protected readonly logger: Logger,
    schedulerRegistry: SchedulerRegistry | undefined,
  ) {
    this.job = new IntervalJob(jobName, schedulerRegistry, () => this.sweepOnce(Date.now()));
  }

  /** What a run is, for log lines: `expiry sweep`. */
  protected abstract readonly what: string;

  /** One run: the work of the job. */
  protected abstract sweepOnce(now: number): Promise<Report>;

  /** How long {@link stop} waits for the run in progress. @default no limit */
  protected stopWaitMs(): number {
    return MAX_TIMER_MS;
  }

  /** Called when {@link stop} left a run in progress: say what that costs. */
  protected leftRunning(): void {}

  /** True once stopping: a run of many steps checks it between them. */
  protected get stopping(): boolean {
    return this.job.stopping;
  }

  /** Runs the work every `intervalMs`. */
  start(): void {
    this.job.start(this.settings.intervalMs, (error) =>
      this.logger.warn(`${this.what} failed; will retry next interval: ${errorMessage(error)}`),
    );
  }

  /** Runs it now (`now` as the time of the run); a call while a run is in progress shares it. */
  sweep(now: number = Date.now()): Promise<Report> {
    return this.job.run(() => this.sweepOnce(now));
  }

  /** Stops the timer; waits up to {@link stopWaitMs} for the run in progress. */
  async stop(): Promise<void> {
    if (!(await this.job.stop(this.stopWaitMs()))) this.leftRunning();
  }
}
