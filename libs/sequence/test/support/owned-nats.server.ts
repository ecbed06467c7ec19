import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * A `nats-server` with JetStream of a test's own, on a free loopback port with its own store
 * directory: for a larger `max_payload` than the machine's server, and for killing and restarting.
 */
export class OwnedNatsServer {
  private process?: ChildProcess;

  private constructor(
    readonly port: number,
    private readonly dir: string,
    private readonly config: string,
  ) {}

  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  static async start(options: { maxPayloadBytes?: number } = {}): Promise<OwnedNatsServer> {
    const dir = mkdtempSync(join(tmpdir(), 'nseq-nats-'));
    const config = join(dir, 'nats.conf');
    const lines = [
      `listen: 127.0.0.1:${await freePort()}`,
      `jetstream { store_dir: ${JSON.stringify(join(dir, 'store'))} }`,
    ];
    if (options.maxPayloadBytes) lines.push(`max_payload: ${options.maxPayloadBytes}`);
    writeFileSync(config, lines.join('\n'));
    const port = Number(/127\.0\.0\.1:(\d+)/.exec(lines[0])![1]);
    const server = new OwnedNatsServer(port, dir, config);
    await server.restart();
    return server;
  }

  /** Starts the server (again, on the same port and store) and waits until it listens. */
  async restart(): Promise<void> {
    const child = spawn(process.env.NATS_SERVER_BIN ?? 'nats-server', ['-c', this.config], {
      stdio: 'ignore',
    });
    this.process = child;
    const deadline = Date.now() + 10_000;
    while (!(await accepts(this.port))) {
      if (child.exitCode !== null || Date.now() > deadline) {
        throw new Error(`nats-server did not start on port ${this.port} (exit ${child.exitCode})`);
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** Freezes the server (SIGSTOP): connections stay open, nothing is answered. */
  pause(): void {
    this.process?.kill('SIGSTOP');
  }

  /** Lets a frozen server go on (SIGCONT). */
  resume(): void {
    this.process?.kill('SIGCONT');
  }

  /** SIGKILLs the server and waits for it to exit. */
  async kill(): Promise<void> {
    const child = this.process;
    if (!child || child.exitCode !== null) return;
    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await exited;
  }

  async stop(): Promise<void> {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = connect(port, '127.0.0.1');
    probe.once('connect', () => {
      probe.destroy();
      resolve(true);
    });
    probe.once('error', () => resolve(false));
  });
}
