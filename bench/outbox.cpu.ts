/**
 * CPU of the processes an outbox measurement involves, per 1,000 messages: this process,
 * RabbitMQ's Erlang VM and PostgreSQL (every process named `postgres`: the postmaster, its
 * background workers and one backend per connection), and the whole machine. Linux /proc only
 * (harness/cpu.ts); elsewhere the parts that need it are left out.
 */
import { CpuMeter, msPerThousand, type CpuReading } from './harness/cpu';

const meter = new CpuMeter(['rabbitmq', 'postgres']);

export function cpuNow(): CpuReading {
  return meter.read();
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
  const spent = CpuMeter.spent(from, to);
  return {
    node: msPerThousand(spent.own, messages),
    rabbitmq: msPerThousand(spent.servers.rabbitmq, messages),
    postgres: msPerThousand(spent.servers.postgres, messages),
    machine: msPerThousand(spent.machine, messages),
  };
}
