/**
 * CPU seconds of the processes a benchmark involves: this process, its servers (RabbitMQ's Erlang
 * VM `beam.smp`, `redis-server`, every `postgres` process) and the whole machine, other tenants
 * included. Linux /proc only; elsewhere the parts that need it are left out, never guessed. Loads
 * nothing but Node: child processes of baselines use it.
 */
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { epochMs, type EpochMs } from './measure';

let clockTicks: number | undefined;

function ticksPerSecond(): number {
  clockTicks ??= Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  return clockTicks;
}

/** CPU seconds (user + system) this process used. */
export function ownCpuSeconds(): number {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1e6;
}

/** CPU seconds (user + system) process `pid` used, from /proc/<pid>/stat; undefined if unknown. */
export function cpuSecondsOf(pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may hold spaces), starting at field 3 (state).
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const utime = Number(fields[11]);
    const stime = Number(fields[12]);
    return (utime + stime) / ticksPerSecond();
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
 * The busiest process named `comm`, by CPU used so far: on a machine where short-lived tools
 * (rabbitmqctl) start the same VM, or tests start Redis servers of their own, that is the server.
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
    const fields = /^cpu\s+(.*)$/m
      .exec(readFileSync('/proc/stat', 'utf8'))?.[1]
      .split(/\s+/)
      .map(Number);
    if (!fields) return undefined;
    // user nice system idle iowait irq softirq steal: busy is everything but idle and iowait.
    const [user, nice, system, , , irq, softirq, steal] = fields;
    return (user + nice + system + irq + softirq + (steal ?? 0)) / ticksPerSecond();
  } catch {
    return undefined;
  }
}

/**
 * The servers a {@link CpuMeter} can follow. RabbitMQ, NATS and Redis are one process each (the busiest
 * of that name when the meter is made); PostgreSQL is every process of its name (the postmaster,
 * its workers, one backend per connection: backends that start while measured count from zero,
 * those that end are missing).
 */
export type ServerName = 'rabbitmq' | 'nats' | 'redis' | 'postgres';

const PROCESS_NAMES: Record<ServerName, { comm: string; every: boolean }> = {
  rabbitmq: { comm: 'beam.smp', every: false },
  nats: { comm: 'nats-server', every: false },
  redis: { comm: 'redis-server', every: false },
  postgres: { comm: 'postgres', every: true },
};

/** CPU seconds so far of this process, the followed servers and the machine, at one instant. */
export interface CpuReading {
  readonly at: EpochMs;
  readonly own: number;
  readonly servers: Partial<Record<ServerName, Map<number, number>>>;
  readonly machine?: number;
}

/** CPU seconds used between two readings; undefined where a reading was missing. */
export interface CpuSpent {
  /** Wall-clock seconds between the readings. */
  readonly wallSeconds: number;
  readonly own: number;
  readonly servers: Partial<Record<ServerName, number>>;
  readonly machine?: number;
  /** Cores the whole machine kept busy meanwhile (2 = this 2-core machine saturated). */
  readonly machineBusyCores?: number;
}

/** Reads the CPU seconds of this process, of `servers`, and of the machine. */
export class CpuMeter {
  private readonly pids: Partial<Record<ServerName, number>> = {};

  constructor(private readonly servers: readonly ServerName[]) {
    for (const server of servers) {
      const { comm, every } = PROCESS_NAMES[server];
      if (!every) this.pids[server] = busiestProcessNamed(comm);
    }
  }

  read(): CpuReading {
    const servers: CpuReading['servers'] = {};
    for (const server of this.servers) {
      const { comm, every } = PROCESS_NAMES[server];
      if (every) {
        servers[server] = cpuByPid(comm);
      } else {
        const pid = this.pids[server];
        const cpu = cpuSecondsOf(pid);
        servers[server] =
          pid === undefined || cpu === undefined ? new Map() : new Map([[pid, cpu]]);
      }
    }
    return { at: epochMs(), own: ownCpuSeconds(), servers, machine: machineCpuSeconds() };
  }

  /** What each part used from `from` to `to`. */
  static spent(from: CpuReading, to: CpuReading): CpuSpent {
    const wallSeconds = (to.at - from.at) / 1000;
    const servers: CpuSpent['servers'] = {};
    for (const [server, after] of Object.entries(to.servers) as Array<
      [ServerName, Map<number, number>]
    >) {
      const before = from.servers[server] ?? new Map<number, number>();
      if (after.size === 0) continue;
      if (!PROCESS_NAMES[server].every && before.size === 0) continue;
      let seconds = 0;
      for (const [pid, cpu] of after) seconds += cpu - (before.get(pid) ?? 0);
      servers[server] = seconds;
    }
    const machine =
      from.machine === undefined || to.machine === undefined
        ? undefined
        : to.machine - from.machine;
    return {
      wallSeconds,
      own: to.own - from.own,
      servers,
      machine,
      machineBusyCores: machine === undefined ? undefined : machine / wallSeconds,
    };
  }
}

/** CPU milliseconds per 1,000 items (events, messages), rounded; undefined stays undefined. */
export function msPerThousand(seconds: number | undefined, items: number): number | undefined {
  return seconds === undefined ? undefined : Math.round((seconds * 1e6) / items);
}
