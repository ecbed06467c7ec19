/** Shared helpers of the benchmarks: every figure is a ratio against a baseline in the same run. */

export const MiB = 1024 * 1024;

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

/** Samples this process's RSS every few ms; `stop()` returns the peak in MiB. */
export function trackPeakRss(intervalMs = 5): { stop(): number } {
  let peak = process.memoryUsage.rss();
  const timer = setInterval(() => (peak = Math.max(peak, process.memoryUsage.rss())), intervalMs);
  return {
    stop() {
      clearInterval(timer);
      return Math.round((Math.max(peak, process.memoryUsage.rss()) / MiB) * 10) / 10;
    },
  };
}

export async function timed(run: () => Promise<void>): Promise<number> {
  const started = process.hrtime.bigint();
  await run();
  return Number(process.hrtime.bigint() - started) / 1e9;
}

export function mbPerSecond(bytes: number, seconds: number): number {
  return Math.round((bytes / MiB / seconds) * 10) / 10;
}

/** One JSON line per result, the benchmarks' output format. */
export function report(result: Record<string, unknown>): void {
  console.log(JSON.stringify(result));
}

/**
 * `BENCH_UNSAFE_SOCKET_TRICKS`: the values of the adapters' `unsafeSocketTricks` a benchmark runs
 * its module path with, in order. `off` (the default): without; `on`: with; `both`: without, then
 * with, each against its own baseline rounds and reported on a line of its own.
 */
export function socketTrickVariants(): boolean[] {
  const value = process.env.BENCH_UNSAFE_SOCKET_TRICKS ?? 'off';
  if (value === 'off') return [false];
  if (value === 'on') return [true];
  if (value === 'both') return [false, true];
  throw new Error(`BENCH_UNSAFE_SOCKET_TRICKS must be off, on or both, got ${value}`);
}
