import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';

const ROOT = resolve(__dirname, '../../../../..');

/** What every line of a fixture's results file has. */
export interface FixtureEvent {
  readonly event: string;
  readonly pid: number;
}

/**
 * A fixture script (under ./fixtures) running in a child process under ts-node, which reports
 * by appending JSON lines to a results file (one per test, possibly shared by several processes)
 * and writes `{"event":"ready","pid":…}` once it consumes.
 */
export abstract class FixtureProcess<E extends FixtureEvent> {
  protected output = '';

  protected constructor(
    protected readonly child: ChildProcess,
    private readonly resultsFile: string,
  ) {
    child.stdout?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    child.stderr?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
  }

  /**
   * Spawns `script` with `env` on top of this process's environment; `stdin` piped for a
   * fixture that waits on it (see {@link FixtureProcess.release}).
   */
  protected static spawnFixture(
    script: string,
    env: Readonly<Record<string, string | undefined>>,
    stdin: 'ignore' | 'pipe' = 'ignore',
  ): ChildProcess {
    return spawn(
      process.execPath,
      ['-r', 'ts-node/register/transpile-only', '-r', 'tsconfig-paths/register', script],
      {
        cwd: ROOT,
        stdio: [stdin, 'pipe', 'pipe'],
        env: { ...process.env, TS_NODE_PROJECT: join(ROOT, 'tsconfig.json'), ...env },
      },
    );
  }

  /**
   * Lets a process spawned held (its fixture loaded, waiting on stdin before it connects) go on,
   * and resolves once it consumes.
   */
  protected async release(): Promise<this> {
    this.child.stdin?.end('go\n');
    return this.ready();
  }

  /** Resolves once this process wrote its "ready" line. */
  protected async ready(): Promise<this> {
    await this.waitFor(
      (events) => events.some((e) => e.event === 'ready' && e.pid === this.child.pid),
      'the consumer process to be ready',
      45_000,
    );
    return this;
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** Every line of the results file so far, from every process that wrote to it. */
  events(): E[] {
    if (!existsSync(this.resultsFile)) return [];
    return readFileSync(this.resultsFile, 'utf8')
      .split('\n')
      .filter((line) => line.length > 0)
      .map((line) => JSON.parse(line) as E);
  }

  /** Polls the results file until `check` holds; fails with the process's output otherwise. */
  async waitFor(check: (events: E[]) => boolean, what: string, timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!check(this.events())) {
      if (this.exited() || Date.now() > deadline) {
        const why = this.exited()
          ? `it exited (code ${this.child.exitCode}, signal ${this.child.signalCode})`
          : 'timed out';
        throw new Error(`waiting for ${what}: ${why}; its output:\n${this.output}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  /** SIGKILL: no shutdown hook runs, nothing is settled; resolves once the process is gone. */
  async kill(): Promise<void> {
    await this.signal('SIGKILL');
  }

  /** Sends `signal` unless the process is gone already; resolves once it exited. */
  protected async signal(signal: NodeJS.Signals): Promise<void> {
    if (this.exited()) return;
    const exited = new Promise((resolve) => this.child.once('exit', resolve));
    this.child.kill(signal);
    await exited;
  }

  protected exited(): boolean {
    return this.child.exitCode !== null || this.child.signalCode !== null;
  }
}
