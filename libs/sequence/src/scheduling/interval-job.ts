import type { SchedulerRegistry } from '@nestjs/schedule';

/**
 * A periodic job of the module (a sweeper). It joins the app's `SchedulerRegistry` when the app
 * imports `ScheduleModule.forRoot()`, so it is listed (and can be stopped) there like the app's
 * own intervals; without it, it is a plain interval. The module never imports
 * `ScheduleModule.forRoot()` itself: a second one would run the app's own jobs twice.
 */
export class IntervalJob {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly name: string,
    private readonly schedulerRegistry: SchedulerRegistry | undefined,
  ) {}

  /** Runs `tick` every `intervalMs` (nothing when `false`); its failures go to `onError`. */
  start(
    intervalMs: number | false,
    tick: () => Promise<unknown>,
    onError: (error: unknown) => void,
  ): void {
    if (intervalMs === false) return;
    this.timer = setInterval(() => void tick().catch(onError), intervalMs);
    // A sweeper alone is no reason to keep a process alive (an app whose bootstrap failed half-way
    // is never closed; its sweepers must not hold the process forever).
    this.timer.unref();
    this.schedulerRegistry?.addInterval(this.name, this.timer);
  }

  stop(): void {
    if (this.schedulerRegistry?.doesExist('interval', this.name)) {
      this.schedulerRegistry.deleteInterval(this.name);
    }
    clearInterval(this.timer);
    this.timer = undefined;
  }
}
