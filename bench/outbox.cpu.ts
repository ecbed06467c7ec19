/**
 * CPU seconds of the processes an outbox measurement involves: this process, RabbitMQ's Erlang VM
 * and PostgreSQL (every process named `postgres`: the postmaster, its background workers and one
 * backend per connection). Linux /proc only; elsewhere the parts that need it are left out.
 */
import {
  busiestProcessNamed,
  cpuByPid,
  cpuSecondsOf,
  machineCpuSeconds,
  ownCpuSeconds,
} from './process-probe';

const rabbitmq = busiestProcessNamed('beam.smp');

export interface CpuReading {
  readonly node: number;
  readonly rabbitmq?: number;
  readonly postgres: Map<number, number>;
  readonly machine?: number;
}

export function cpuNow(): CpuReading {
  return {
    node: ownCpuSeconds(),
    rabbitmq: cpuSecondsOf(rabbitmq),
    postgres: cpuByPid('postgres'),
    machine: machineCpuSeconds(),
  };
}

/** CPU milliseconds per 1,000 messages between two readings. */
export interface CpuPerThousand {
  node?: number;
  rabbitmq?: number;
  /** Backends that ended between the readings are missing (pools stay open while measured). */
  postgres?: number;
  /** Every process of the machine, other tenants included. */
  machine?: number;
}

export function cpuPerThousand(from: CpuReading, to: CpuReading, messages: number): CpuPerThousand {
  const per = (a?: number, b?: number) =>
    a === undefined || b === undefined ? undefined : Math.round(((b - a) * 1e6) / messages);
  let postgres = 0;
  for (const [pid, cpu] of to.postgres) postgres += cpu - (from.postgres.get(pid) ?? 0);
  return {
    node: per(from.node, to.node),
    rabbitmq: per(from.rabbitmq, to.rabbitmq),
    postgres: to.postgres.size > 0 ? Math.round((postgres * 1e6) / messages) : undefined,
    machine: per(from.machine, to.machine),
  };
}
