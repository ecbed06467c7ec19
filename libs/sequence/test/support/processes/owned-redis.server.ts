import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { accepts, awaitAnswering, sparePort, stopProcess } from './server-process';

/**
 * A `redis-server` the test owns, on a spare loopback port, so that it can be crashed, paused and
 * restarted without touching the shared server. With `appendOnly`, every write is fsynced to an
 * append-only file before Redis answers (`appendfsync always`), so a restart after SIGKILL keeps
 * everything Redis acknowledged; without it nothing survives a restart.
 */
export class OwnedRedisServer {
  private process?: ChildProcess;
  private output = '';

  private constructor(
    readonly port: number,
    private readonly dir: string,
    private readonly appendOnly: boolean,
  ) {}

  static async start(options: { appendOnly: boolean }): Promise<OwnedRedisServer> {
    const server = new OwnedRedisServer(
      await sparePort(),
      mkdtempSync(join(tmpdir(), 'nseq-fault-redis-')),
      options.appendOnly,
    );
    await server.restart();
    return server;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  get pid(): number | undefined {
    return this.process?.pid;
  }

  /** Starts the server (again) on the same port and directory; resolves once it accepts connections. */
  async restart(): Promise<void> {
    if (this.process) throw new Error('redis-server is already running');
    const child = spawn(
      'redis-server',
      [
        '--port',
        String(this.port),
        '--bind',
        '127.0.0.1',
        '--dir',
        this.dir,
        '--save',
        '',
        '--appendonly',
        this.appendOnly ? 'yes' : 'no',
        '--appendfsync',
        'always',
        '--daemonize',
        'no',
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    child.stdout?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    child.stderr?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    this.process = child;
    try {
      await awaitAnswering(child, () => accepts(this.port), 10_000, 20);
    } catch (error) {
      this.process = undefined;
      throw new Error(
        `redis-server did not start on port ${this.port} (${(error as Error).message}):\n${this.output}`,
      );
    }
  }

  /** Stops the server with `signal` (SIGKILL: a crash) and waits until it is gone. */
  async stop(signal: NodeJS.Signals = 'SIGKILL'): Promise<void> {
    const child = this.process;
    if (!child) return;
    this.process = undefined;
    await stopProcess(child, signal);
  }

  /** Freezes the server (SIGSTOP): connections stay open, nothing answers. */
  pause(): void {
    this.process?.kill('SIGSTOP');
  }

  resume(): void {
    this.process?.kill('SIGCONT');
  }

  /** Kills the server (resuming it first if paused) and removes its directory. */
  async dispose(): Promise<void> {
    this.resume();
    await this.stop('SIGKILL');
    rmSync(this.dir, { recursive: true, force: true });
  }
}
