import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { GapPolicy } from 'nest-sequence';

const ROOT = resolve(__dirname, '../../../../..');
const SCRIPT = resolve(__dirname, '../fixtures/resequencer-consumer.process.ts');

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
export class ResequencerConsumerProcess {
  private output = '';

  private constructor(
    private readonly child: ChildProcess,
    private readonly resultsFile: string,
  ) {
    child.stdout?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    child.stderr?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
  }

  /** Starts one and resolves once it consumes (its "ready" line). */
  static async start(settings: ResequencerConsumerSettings): Promise<ResequencerConsumerProcess> {
    const resultsFile = join(settings.dir, 'results.jsonl');
    const optional = (value: number | string | undefined) =>
      value === undefined ? undefined : String(value);
    const child = spawn(
      process.execPath,
      ['-r', 'ts-node/register/transpile-only', '-r', 'tsconfig-paths/register', SCRIPT],
      {
        cwd: ROOT,
        stdio: ['ignore', 'pipe', 'pipe'],
        env: {
          ...process.env,
          TS_NODE_PROJECT: join(ROOT, 'tsconfig.json'),
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
          CALL_HANDLER: settings.callHandler ? '1' : '0',
          BLOCK_ON: settings.blockOn,
          GAP_POLICY: settings.gapPolicy,
          GAP_TIMEOUT_MS: optional(settings.gapTimeoutMs),
        },
      },
    );
    const consumer = new ResequencerConsumerProcess(child, resultsFile);
    await consumer.waitFor(
      (events) => events.some((e) => e.event === 'ready' && e.pid === child.pid),
      'the consumer process to be ready',
      20_000,
    );
    return consumer;
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** Every line of the results file so far, from every process that wrote to it. */
  events(): ResequencerConsumerEvent[] {
    if (!existsSync(this.resultsFile)) return [];
    return readFileSync(this.resultsFile, 'utf8')
      .split('\n')
      .filter((line) => line.length > 0)
      .map((line) => JSON.parse(line) as ResequencerConsumerEvent);
  }

  /** This process's own lines. */
  ownEvents(): ResequencerConsumerEvent[] {
    return this.events().filter((e) => e.pid === this.pid);
  }

  /** Polls the results file until `check` holds; fails with the process's output otherwise. */
  async waitFor(
    check: (events: ResequencerConsumerEvent[]) => boolean,
    what: string,
    timeoutMs = 10_000,
  ): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!check(this.events())) {
      if (this.exited() || Date.now() > deadline) {
        const why = this.exited() ? `it exited (${this.child.exitCode})` : 'timed out';
        throw new Error(`waiting for ${what}: ${why}; its output:\n${this.output}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  /** SIGTERM: a graceful close, after which it reports its `stats` line; resolves once it exited. */
  async stop(): Promise<ResequencerConsumerEvent> {
    if (!this.exited()) {
      const exited = new Promise((resolve) => this.child.once('exit', resolve));
      this.child.kill('SIGTERM');
      await exited;
    }
    const stats = this.ownEvents().find((e) => e.event === 'stats');
    if (!stats) throw new Error(`process ${this.pid} left no stats; its output:\n${this.output}`);
    return stats;
  }

  /** SIGKILL: no shutdown hook runs, nothing is settled; resolves once the process is gone. */
  async kill(): Promise<void> {
    if (this.exited()) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.kill('SIGKILL');
    await exited;
  }

  private exited(): boolean {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }
}
