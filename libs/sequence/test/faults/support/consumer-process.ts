import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const ROOT = resolve(__dirname, '../../../../..');
const SCRIPT = resolve(__dirname, '../fixtures/consumer.process.ts');

/** A line of the consumer process's results file (see fixtures/consumer.process.ts). */
export interface ConsumerEvent {
  readonly event: 'ready' | 'started' | 'delivered';
  readonly pid: number;
  /** Epoch milliseconds. */
  readonly at: number;
  readonly sequenceId?: string;
  readonly bytes?: number;
  readonly sha256?: string;
  readonly fragments?: number;
}

export interface ConsumerProcessSettings {
  readonly amqpUrl: string;
  readonly redisUrl: string;
  readonly channel: string;
  readonly prefix: string;
  /** Where the results file and the delivered payloads go (one directory per test). */
  readonly dir: string;
  readonly leaseMs?: number;
  readonly handlerSleepMs?: number;
}

/** fixtures/consumer.process.ts running in a child process. */
export class ConsumerProcess {
  private output = '';

  private constructor(
    private readonly child: ChildProcess,
    private readonly resultsFile: string,
  ) {
    child.stdout?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    child.stderr?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
  }

  /** Starts one and resolves once it consumes (its "ready" line). */
  static async start(settings: ConsumerProcessSettings): Promise<ConsumerProcess> {
    const resultsFile = join(settings.dir, 'results.jsonl');
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
          PREFIX: settings.prefix,
          RESULTS_FILE: resultsFile,
          PAYLOAD_DIR: settings.dir,
          LEASE_MS: String(settings.leaseMs ?? 30_000),
          HANDLER_SLEEP_MS: String(settings.handlerSleepMs ?? 0),
        },
      },
    );
    const consumer = new ConsumerProcess(child, resultsFile);
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
  events(): ConsumerEvent[] {
    if (!existsSync(this.resultsFile)) return [];
    return readFileSync(this.resultsFile, 'utf8')
      .split('\n')
      .filter((line) => line.length > 0)
      .map((line) => JSON.parse(line) as ConsumerEvent);
  }

  /** Polls the results file until `check` holds; fails with the process's output otherwise. */
  async waitFor(
    check: (events: ConsumerEvent[]) => boolean,
    what: string,
    timeoutMs = 10_000,
  ): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!check(this.events())) {
      if (this.child.exitCode !== null || Date.now() > deadline) {
        const why =
          this.child.exitCode !== null ? `it exited (${this.child.exitCode})` : 'timed out';
        throw new Error(`waiting for ${what}: ${why}; its output:\n${this.output}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  /** SIGKILL: no shutdown hook runs, nothing is settled; resolves once the process is gone. */
  async kill(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.kill('SIGKILL');
    await exited;
  }
}
