import type { SchedulerRegistry } from '@nestjs/schedule';
import { MAX_TIMER_MS, settlesWithin } from '../core/async';

/**
 * A periodic job of the module (a sweeper). It joins the app's `SchedulerRegistry` when the app
 * imports `ScheduleModule.forRoot()`, so it is listed (and can be stopped) there like the app's
 * own intervals; without it, it is a plain interval. The module never imports
 * `ScheduleModule.forRoot()` itself: a second one would run the app's own jobs twice.
 *
 * Runs never overlap: a tick (or a caller of {@link run}) while a run is in progress shares it.
 */
export class IntervalJob<T> {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<T> | undefined;
  private stopped = false;

  constructor(
    private readonly name: string,
    private readonly schedulerRegistry: SchedulerRegistry | undefined,
    private readonly work: () => Promise<T>,
  ) {}

  /** Runs the work every `intervalMs` (nothing when `false`); its failures go to `onError`. */
  start(intervalMs: number | false, onError: (error: unknown) => void): void {
    if (intervalMs === false) return;
    this.timer = setInterval(() => void this.run().catch(onError), intervalMs);
    // A sweeper alone is no reason to keep a process alive (an app whose bootstrap failed half-way
    // is never closed; its sweepers must not hold the process forever).
    this.timer.unref();
    this.schedulerRegistry?.addInterval(this.name, this.timer);
  }

  /** Runs the work now, or joins the run in progress. */
  run(work: () => Promise<T> = this.work): Promise<T> {
    this.running ??= work().finally(() => (this.running = undefined));
    return this.running;
  }

  /** True once {@link stop} was called: work of many steps checks it between them. */
  get stopping(): boolean {
    return this.stopped;
  }

  /**
   * Stops the timer; resolves once the run in progress, if any, has settled, or after `maxWaitMs`
   * (a store call that never answers must not hold the application's shutdown forever). Resolves
   * to false when that run was left running.
   */
  async stop(maxWaitMs: number = MAX_TIMER_MS): Promise<boolean> {
    this.stopped = true;
    if (this.schedulerRegistry?.doesExist('interval', this.name)) {
      this.schedulerRegistry.deleteInterval(this.name);
    }
    clearInterval(this.timer);
    this.timer = undefined;
    return !this.running || settlesWithin(this.running, maxWaitMs);
  }
}
