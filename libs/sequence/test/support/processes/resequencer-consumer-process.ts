import { join, resolve } from 'node:path';
import type { GapPolicy } from 'nest-sequence/ports';
import { FixtureProcess } from './fixture-process';

const SCRIPT = resolve(__dirname, 'fixtures/resequencer-consumer.process.ts');

/** A line of the results file (see fixtures/resequencer-consumer.process.ts). */
export interface ResequencerConsumerEvent {
  readonly event: 'ready' | 'handled' | 'blocked' | 'stats';
  readonly pid: number;
  /** Epoch milliseconds. */
  readonly at: number;
  readonly key?: string;
  readonly seq?: number;
  /** `stats`: the instance's input events by outcome (released, buffered, duplicate, late…). */
  readonly outcomes?: Readonly<Record<string, number>>;
  /** `stats`: events the instance delivered. */
  readonly delivered?: number;
  /** `stats`: the most publishes of one key to the output awaiting their confirms at once. */
  readonly maxKeyInFlight?: number;
}

export interface ResequencerConsumerSettings {
  readonly amqpUrl: string;
  readonly redisUrl: string;
  readonly channel: string;
  readonly output: string;
  readonly prefix: string;
  /** Where the results file goes (one directory per test, shared by its processes). */
  readonly dir: string;
  readonly leaseMs?: number;
  readonly drainBatch?: number;
  readonly prefetch?: number;
  readonly sweepIntervalMs?: number;
  /** The resequencer's `outputInFlight`. @default 1 */
  readonly outputInFlight?: number;
  /** Call the handler after each output publish (it reports `handled`). */
  readonly callHandler?: boolean;
  /** `key:seq` on which the handler hangs until the process is killed (once per test). */
  readonly blockOn?: string;
  /** @default 'alert' */
  readonly gapPolicy?: GapPolicy;
  /** @default 600_000: no gap policy applies */
  readonly gapTimeoutMs?: number;
}

/** fixtures/resequencer-consumer.process.ts running in a child process. */
export class ResequencerConsumerProcess extends FixtureProcess<ResequencerConsumerEvent> {
  /** Starts one and resolves once it consumes (its "ready" line). */
  static async start(settings: ResequencerConsumerSettings): Promise<ResequencerConsumerProcess> {
    const resultsFile = join(settings.dir, 'results.jsonl');
    const optional = (value: number | string | undefined) =>
      value === undefined ? undefined : String(value);
    const child = FixtureProcess.spawnFixture(SCRIPT, {
      AMQP_URL: settings.amqpUrl,
      REDIS_URL: settings.redisUrl,
      CHANNEL: settings.channel,
      OUTPUT: settings.output,
      PREFIX: settings.prefix,
      RESULTS_FILE: resultsFile,
      LEASE_MS: optional(settings.leaseMs),
      DRAIN_BATCH: optional(settings.drainBatch),
      PREFETCH: optional(settings.prefetch),
      SWEEP_INTERVAL_MS: optional(settings.sweepIntervalMs),
      OUTPUT_IN_FLIGHT: optional(settings.outputInFlight),
      CALL_HANDLER: settings.callHandler ? '1' : '0',
      BLOCK_ON: settings.blockOn,
      GAP_POLICY: settings.gapPolicy,
      GAP_TIMEOUT_MS: optional(settings.gapTimeoutMs),
    });
    return new ResequencerConsumerProcess(child, resultsFile).ready();
  }

  /** This process's own lines. */
  ownEvents(): ResequencerConsumerEvent[] {
    return this.events().filter((e) => e.pid === this.pid);
  }

  /** SIGTERM: a graceful close, after which it reports its `stats` line; resolves once it exited. */
  async stop(): Promise<ResequencerConsumerEvent> {
    await this.signal('SIGTERM');
    const stats = this.ownEvents().find((e) => e.event === 'stats');
    if (!stats) throw new Error(`process ${this.pid} left no stats; its output:\n${this.output}`);
    return stats;
  }
}
