/**
 * Memory and CPU readings of the benchmark's processes (Linux /proc; elsewhere the parts that need
 * it are left out, never guessed).
 */
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { MiB } from './bench.util';

const round1 = (value: number) => Math.round(value * 10) / 10;

/**
 * Peak RSS of this process since the last `reset()`, two ways: sampled every `intervalMs` (what
 * a monitoring agent would see), and the kernel's high-water mark VmHWM, which also catches peaks
 * between samples or while the event loop is busy. VmHWM is reset through /proc/self/clear_refs;
 * when that is refused, only the sampled peak is reported.
 */
export class PeakMemory {
  private sampled = 0;
  private hwmResettable = false;
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

  read(): {
    peakRssMiB: number;
    hwmRssMiB?: number;
    peakAt?: number;
    peakHeapMiB?: number;
    peakHeapTotalMiB?: number;
    peakBuffersMiB?: number;
  } {
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
    const { heapUsed, heapTotal, external, arrayBuffers } = process.memoryUsage();
    this.atPeak = { at: Date.now(), heapUsed, heapTotal, external, arrayBuffers };
  }

  /** When the sampled peak was seen, and the V8 heap and Buffer memory then. */
  atPeak?: {
    at: number;
    heapUsed: number;
    heapTotal: number;
    external: number;
    arrayBuffers: number;
  };
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

/** CPU seconds (user + system) this process used. */
export function ownCpuSeconds(): number {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1e6;
}

let clockTicks: number | undefined;

/** CPU seconds (user + system) process `pid` used, from /proc/<pid>/stat; undefined if unknown. */
export function cpuSecondsOf(pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined;
  try {
    clockTicks ??= Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may hold spaces), starting at field 3 (state).
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const utime = Number(fields[11]);
    const stime = Number(fields[12]);
    return (utime + stime) / clockTicks;
  } catch {
    return undefined;
  }
}

/** CPU seconds so far per pid of every process named `comm` (empty without /proc). */
export function cpuByPid(comm: string): Map<number, number> {
  const result = new Map<number, number>();
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return result;
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/comm`, 'utf8').trim() !== comm) continue;
    } catch {
      continue;
    }
    const cpu = cpuSecondsOf(Number(entry));
    if (cpu !== undefined) result.set(Number(entry), cpu);
  }
  return result;
}

/**
 * The busiest process named `comm` (e.g. `beam.smp`, RabbitMQ's Erlang VM), by CPU used so far:
 * on a machine where short-lived tools (rabbitmqctl) start the same VM, that is the server.
 */
export function busiestProcessNamed(comm: string): number | undefined {
  let best: { pid: number; cpu: number } | undefined;
  for (const [pid, cpu] of cpuByPid(comm)) {
    if (!best || cpu > best.cpu) best = { pid, cpu };
  }
  return best?.pid;
}

/** CPU seconds every process of the machine used so far (busy jiffies of /proc/stat), if known. */
export function machineCpuSeconds(): number | undefined {
  try {
    clockTicks ??= Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
    const fields = /^cpu\s+(.*)$/m
      .exec(readFileSync('/proc/stat', 'utf8'))?.[1]
      .split(/\s+/)
      .map(Number);
    if (!fields) return undefined;
    // user nice system idle iowait irq softirq steal: busy is everything but idle and iowait.
    const [user, nice, system, , , irq, softirq, steal] = fields;
    return (user + nice + system + irq + softirq + (steal ?? 0)) / clockTicks;
  } catch {
    return undefined;
  }
}
