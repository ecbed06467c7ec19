import type { Scripts } from './redis-scripts';

/**
 * The clock the callers' times come from (`now`, deadlines), as the Redis stores pass them to
 * their scripts, which move them onto Redis's clock when this one is off (lua/_clock.lua; "Clocks"
 * in docs/configuration.md).
 */
export class RedisClock {
  constructor(
    private readonly scripts: Scripts,
    /** This machine's clock: what the callers' `now` is read from. */
    private readonly localClock: () => number = () => Date.now(),
  ) {}

  /** A caller's time as a script argument: the time and this machine's clock as the call leaves. */
  stamp(time: number): string {
    const clock = this.localClock();
    if (!Number.isFinite(clock)) {
      throw new TypeError(`the store's clock must return the time in ms, returned ${clock}`);
    }
    return `${time}:${clock}`;
  }

  /** A caller's time on the scripts' clock, for the reads that run no script. */
  async onRedisClock(time: number): Promise<number> {
    return Number(await this.scripts.clock([], [this.stamp(time)]));
  }
}

/** What is wrong with a `clock` option, if anything. */
export function clockProblem(clock: unknown): string | undefined {
  if (clock === undefined || typeof clock === 'function') return undefined;
  return `clock must be a function that returns the time in ms (like Date.now), got ${typeof clock}`;
}
