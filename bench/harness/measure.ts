/**
 * Time and memory readings of one process: a clock that parent and children share, peak RSS
 * (sampled, and the kernel's high-water mark), and garbage-collection pauses. Linux /proc where
 * needed; elsewhere the parts that need it are left out, never guessed. Loads nothing but Node:
 * child processes of baselines use it.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { constants, PerformanceObserver, type PerformanceEntry } from 'node:perf_hooks';

export const MiB = 1024 * 1024;

const round1 = (value: number) => Math.round(value * 10) / 10;

/** Milliseconds since the epoch, sub-millisecond, comparable between processes. */
export type EpochMs = number;

/** Now, as {@link EpochMs} (performance.timeOrigin + performance.now()). */
export function epochMs(): EpochMs {
  return performance.timeOrigin + performance.now();
}

/** Seconds `run` took. */
export async function timed(run: () => Promise<void>): Promise<number> {
  const started = process.hrtime.bigint();
  await run();
  return Number(process.hrtime.bigint() - started) / 1e9;
}

/** This process's RSS now, in MiB (one decimal). */
export function rssMiB(): number {
  return round1(process.memoryUsage.rss() / MiB);
}

/** The peak since the last reset, and what it was made of. */
export interface PeakReading {
  /** Highest RSS seen by sampling. */
  readonly peakRssMiB: number;
  /** The kernel's peak RSS (VmHWM), when it could be reset. */
  readonly hwmRssMiB?: number;
  /** When the sampled peak was seen (epoch ms), and the V8 heap and Buffer memory then. */
  readonly peakAt?: number;
  readonly peakHeapMiB?: number;
  /** V8 heap reserved (young and old generations), used or not. */
  readonly peakHeapTotalMiB?: number;
  readonly peakBuffersMiB?: number;
}

/**
 * Peak RSS of this process since the last `reset()`, two ways: sampled every `intervalMs` (what
 * a monitoring agent would see), and the kernel's high-water mark VmHWM, which also catches peaks
 * between samples or while the event loop is busy. VmHWM is reset through /proc/self/clear_refs;
 * when that is refused, only the sampled peak is reported.
 */
export class PeakMemory {
  private sampled = 0;
  private hwmResettable = false;
  private atPeak?: { at: number; heapUsed: number; heapTotal: number; arrayBuffers: number };
  private readonly timer: NodeJS.Timeout;

  constructor(intervalMs: number) {
    this.reset();
    this.timer = setInterval(() => this.sample(), intervalMs);
    this.timer.unref();
  }

  reset(): void {
    try {
      writeFileSync('/proc/self/clear_refs', '5');
      this.hwmResettable = true;
    } catch {
      this.hwmResettable = false;
    }
    this.sampled = 0;
    this.atPeak = undefined;
    this.sample();
  }

  read(): PeakReading {
    this.sample();
    const hwm = this.hwmResettable ? statusKiB('VmHWM') : undefined;
    return {
      peakRssMiB: round1(this.sampled / MiB),
      hwmRssMiB: hwm === undefined ? undefined : round1(hwm / 1024),
      peakAt: this.atPeak?.at,
      peakHeapMiB: this.atPeak && round1(this.atPeak.heapUsed / MiB),
      peakHeapTotalMiB: this.atPeak && round1(this.atPeak.heapTotal / MiB),
      peakBuffersMiB: this.atPeak && round1(this.atPeak.arrayBuffers / MiB),
    };
  }

  stop(): void {
    clearInterval(this.timer);
  }

  private sample(): void {
    const rss = process.memoryUsage.rss();
    if (rss <= this.sampled) return;
    this.sampled = rss;
    // What the peak is made of (rare: only on a new peak).
    const { heapUsed, heapTotal, arrayBuffers } = process.memoryUsage();
    this.atPeak = { at: Date.now(), heapUsed, heapTotal, arrayBuffers };
  }
}

function statusKiB(field: string): number | undefined {
  try {
    const match = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(
      readFileSync('/proc/self/status', 'utf8'),
    );
    return match ? Number(match[1]) : undefined;
  } catch {
    return undefined;
  }
}

const GC_KINDS: Record<number, string> = {
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'scavenge',
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'markCompact',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incrementalMarking',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakCallbacks',
};

/** Garbage collections (pauses on the main thread) by kind: count and milliseconds. */
export type GcTally = Record<string, { count: number; ms: number }>;

/** Counts this process's garbage collections from its creation, or the last `reset()`. */
export class GcPauses {
  private tally: GcTally = {};

  constructor() {
    new PerformanceObserver((list) => {
      for (const entry of list.getEntries() as Array<
        PerformanceEntry & { detail?: { kind: number } }
      >) {
        const kind = GC_KINDS[entry.detail?.kind ?? -1] ?? 'other';
        const counted = (this.tally[kind] ??= { count: 0, ms: 0 });
        counted.count++;
        counted.ms = Math.round((counted.ms + entry.duration) * 10) / 10;
      }
    }).observe({ entryTypes: ['gc'] });
  }

  /** Starts counting afresh; what was counted so far stays with whoever read it. */
  reset(): void {
    this.tally = {};
  }

  read(): GcTally {
    return this.tally;
  }
}
