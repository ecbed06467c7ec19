import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { accepts, awaitAnswering, sparePort, stopProcess } from './server-process';

/**
 * A `nats-server` with JetStream that the test owns, on a spare loopback port with its own store
 * directory: for a larger `max_payload` than the machine's server, and for crashing, pausing and
 * restarting without touching the shared one. JetStream keeps its streams in the store directory,
 * so a restart after SIGKILL finds what the server had acknowledged.
 */
export class OwnedNatsServer {
  private process?: ChildProcess;
  private output = '';

  private constructor(
    readonly port: number,
    private readonly dir: string,
  ) {}

  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  static async start(options: { maxPayloadBytes?: number } = {}): Promise<OwnedNatsServer> {
    const server = new OwnedNatsServer(
      await sparePort(),
      mkdtempSync(join(tmpdir(), 'nseq-nats-')),
    );
    const lines = [
      `listen: 127.0.0.1:${server.port}`,
      `jetstream { store_dir: ${JSON.stringify(join(server.dir, 'store'))} }`,
    ];
    if (options.maxPayloadBytes) lines.push(`max_payload: ${options.maxPayloadBytes}`);
    writeFileSync(server.config, lines.join('\n'));
    await server.restart();
    return server;
  }

  private get config(): string {
    return join(this.dir, 'nats.conf');
  }

  /** Starts the server (again) on the same port and store; resolves once it accepts connections. */
  async restart(): Promise<void> {
    if (this.process) throw new Error('nats-server is already running');
    const child = spawn(process.env.NATS_SERVER_BIN ?? 'nats-server', ['-c', this.config], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    child.stderr?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    this.process = child;
    try {
      await awaitAnswering(child, () => accepts(this.port), 10_000, 50);
    } catch (error) {
      this.process = undefined;
      throw new Error(
        `nats-server did not start on port ${this.port} (${(error as Error).message}):\n${this.output}`,
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

  /** Freezes the server (SIGSTOP): connections stay open, nothing is answered. */
  pause(): void {
    this.process?.kill('SIGSTOP');
  }

  /** Lets a frozen server go on (SIGCONT). */
  resume(): void {
    this.process?.kill('SIGCONT');
  }

  /** Kills the server (resuming it first if paused) and removes its store directory. */
  async dispose(): Promise<void> {
    this.resume();
    await this.stop('SIGKILL');
    rmSync(this.dir, { recursive: true, force: true });
  }
}
