import { spawn, type ChildProcess } from 'node:child_process';
import { rmSync } from 'node:fs';
import { connect, createServer } from 'node:net';

/**
 * Resolves once `answers()` says the server `child` runs is up. Kills it (SIGKILL) and rejects
 * when it exits first or `timeoutMs` passes: the caller reports why, with the server's output.
 */
export async function awaitAnswering(
  child: ChildProcess,
  answers: () => Promise<boolean>,
  timeoutMs: number,
  intervalMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await answers())) {
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(child.exitCode !== null ? 'the server exited' : 'the server did not answer');
    }
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/** Sends `signal` to `child` unless it has already exited, and resolves once it has. */
export async function stopProcess(child: ChildProcess, signal: NodeJS.Signals): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill(signal);
  await exited;
}

/** SIGTERM, then SIGKILL after `graceMs`; resolves once the process exited. */
export function terminateProcess(child: ChildProcess, graceMs = 5_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const force = setTimeout(() => child.kill('SIGKILL'), graceMs);
    child.once('exit', () => {
      clearTimeout(force);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

/** A loopback port nobody listens on right now. */
export function sparePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() =>
        typeof address === 'object' && address
          ? resolve(address.port)
          : reject(new Error('no port')),
      );
    });
  });
}

/** Whether nothing listens on `port` on the loopback interface. */
export function isFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', () => resolve(false));
    probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)));
  });
}

/** Whether something accepts a TCP connection on `port` on the loopback interface. */
export function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

/**
 * A server process the test owns, on a spare loopback port with a directory of its own: started
 * (again) by the subclass's `restart`, crashed with `stop('SIGKILL')`, frozen with `pause`, and
 * removed with its directory by `dispose`.
 */
export abstract class OwnedServerProcess {
  private process?: ChildProcess;
  private output = '';

  protected constructor(
    readonly port: number,
    protected readonly dir: string,
  ) {}

  get pid(): number | undefined {
    return this.process?.pid;
  }

  /** Starts the server (again) on the same port and directory; resolves once it accepts connections. */
  abstract restart(): Promise<void>;

  /** Runs `command` with `args` as the server; resolves once it accepts connections on `port`. */
  protected async launch(command: string, args: readonly string[]): Promise<void> {
    if (this.process) throw new Error(`${command} is already running`);
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    child.stderr?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    this.process = child;
    try {
      await awaitAnswering(child, () => accepts(this.port), 10_000, 20);
    } catch (error) {
      this.process = undefined;
      throw new Error(
        `${command} did not start on port ${this.port} (${(error as Error).message}):\n${this.output}`,
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

  /** Lets a frozen server go on (SIGCONT). */
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
