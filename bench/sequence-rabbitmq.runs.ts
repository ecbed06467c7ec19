/**
 * One run of bench:sequence, driven from the producer: arm the consumer, publish, stop the clock
 * when the consumer has every byte, wait for it to settle, and put the run's figures together
 * with the CPU the producer, the broker (RabbitMQ or NATS), Redis and the machine spent
 * meanwhile.
 */
import type { Redis } from 'ioredis';
import type { BenchChild } from './harness/child-process';
import { CpuMeter, type CpuReading, type ServerName } from './harness/cpu';
import { epochMs } from './harness/measure';
import { round2 } from './harness/report';
import type { FromConsumer, ModuleTrace, ToConsumer } from './sequence-rabbitmq.protocol';

export type Consumer = BenchChild<ToConsumer, FromConsumer>;

interface RedisCounters {
  cpuSeconds: number;
  commands: Record<string, { calls: number; usec: number }>;
}

/** Redis's own CPU and per-command server time so far (INFO cpu, INFO commandstats). */
async function redisCounters(redis: Redis): Promise<RedisCounters> {
  const [cpu, commandstats] = await Promise.all([redis.info('cpu'), redis.info('commandstats')]);
  const field = (name: string) => Number(new RegExp(`^${name}:([\\d.]+)`, 'm').exec(cpu)?.[1] ?? 0);
  const commands: RedisCounters['commands'] = {};
  for (const match of commandstats.matchAll(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/gm)) {
    commands[match[1]] = { calls: Number(match[2]), usec: Number(match[3]) };
  }
  return { cpuSeconds: field('used_cpu_sys') + field('used_cpu_user'), commands };
}

interface Snapshot {
  cpu: CpuReading;
  redis: RedisCounters;
}

export interface RunFigures {
  seconds: number;
  publishSeconds: number;
  peakRssMiB: number;
  hwmRssMiB?: number;
  /** At the sampled peak: ms since t0, V8 heap used, Buffer (ArrayBuffer) memory. */
  peak: { atMs?: number; heapMiB?: number; heapTotalMiB?: number; buffersMiB?: number };
  /** CPU seconds each process used during the run. */
  cpu: { producer: number; consumer: number; rabbitmq?: number; nats?: number; redis: number };
  /** Cores busy on the whole machine during the run, other tenants included (2 = saturated). */
  machineBusyCores?: number;
  /** Redis server time by command during the run (the server is shared: other clients count). */
  redisServerMs: Record<string, number>;
  trace?: ModuleTrace;
  t0: number;
}

export class RunDriver {
  private readonly cpu: CpuMeter;

  constructor(
    private readonly redis: Redis,
    private readonly timeoutMs: number,
    /** The broker's server process. */
    private readonly broker: Extract<ServerName, 'rabbitmq' | 'nats'> = 'rabbitmq',
  ) {
    this.cpu = new CpuMeter([broker]);
  }

  private async snapshot(): Promise<Snapshot> {
    return { cpu: this.cpu.read(), redis: await redisCounters(this.redis) };
  }

  /** One run: arm the consumer, publish, stop the clock when the consumer has every byte. */
  async run(
    consumer: Consumer,
    run: string,
    bytes: number,
    publish: () => Promise<unknown>,
  ): Promise<RunFigures> {
    consumer.send({ type: 'arm', run, bytes });
    await consumer.next('armed', 10_000);
    const before = await this.snapshot();
    const t0 = epochMs();
    let publishedAt = Number.NaN;
    const published = publish().then(() => (publishedAt = epochMs()));
    const done = consumer.next('done', this.timeoutMs);
    // Either failing fails the run at once (the other's later failure is not news).
    published.catch(() => undefined);
    done.catch(() => undefined);
    const [, finished] = await Promise.all([published, done]);
    if (finished.run !== run || finished.bytes !== bytes) {
      throw new Error(
        `${consumer.label}: run ${finished.run} delivered ${finished.bytes} bytes, expected ${bytes}`,
      );
    }
    const settled = await consumer.next('settled', 60_000);
    const after = await this.snapshot();
    const redisServerMs: Record<string, number> = {};
    for (const [command, { usec }] of Object.entries(after.redis.commands)) {
      const delta = usec - (before.redis.commands[command]?.usec ?? 0);
      // Commands run inside scripts count too (hset in evalsha); under 1 ms: others' noise.
      if (delta >= 1000) redisServerMs[command] = Math.round(delta / 100) / 10;
    }
    const spent = CpuMeter.spent(before.cpu, after.cpu);
    const broker = spent.servers[this.broker];
    return {
      seconds: (finished.receivedAt - t0) / 1000,
      publishSeconds: (publishedAt - t0) / 1000,
      peakRssMiB: settled.peakRssMiB,
      hwmRssMiB: settled.hwmRssMiB,
      peak: {
        atMs: settled.peakAt === undefined ? undefined : Math.round(settled.peakAt - t0),
        heapMiB: settled.peakHeapMiB,
        heapTotalMiB: settled.peakHeapTotalMiB,
        buffersMiB: settled.peakBuffersMiB,
      },
      cpu: {
        producer: round2(spent.own),
        consumer: settled.cpuSeconds,
        [this.broker]: broker === undefined ? undefined : round2(broker),
        redis: round2(after.redis.cpuSeconds - before.redis.cpuSeconds),
      },
      machineBusyCores:
        spent.machineBusyCores === undefined ? undefined : round2(spent.machineBusyCores),
      redisServerMs,
      trace: settled.trace,
      t0,
    };
  }
}
