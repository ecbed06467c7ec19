/**
 * The Claim Check benchmark's side of its child processes (claim-check.child.ts): forking one
 * per role, waiting for their messages, stopping them; and the cleanup steps that run however the
 * benchmark ends.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { join, resolve } from 'node:path';
import type { PlainJsBuild } from './harness/plain-js-build';
import {
  epochMs,
  SIGNING_SECRET_ENV,
  type ChildConfig,
  type FromChild,
  type ToChild,
} from './claim-check.protocol';

/** Progress and diagnostics: stderr, so that stdout carries only the JSON result line. */
export function progress(line: string): void {
  process.stderr.write(`[bench:claim-check] ${line}\n`);
}

export function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

export async function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

// ------------------------------------------------------------------------------- cleanup

/** Undo steps, run last-registered first, once, whatever happened. */
const undo: Array<{ name: string; run: () => Promise<void> | void }> = [];
let cleaning: Promise<boolean> | undefined;

export function onCleanup(name: string, run: () => Promise<void> | void): void {
  undo.push({ name, run });
}

/** Runs every undo step; resolves whether all of them succeeded. */
export function cleanUp(): Promise<boolean> {
  cleaning ??= (async () => {
    let clean = true;
    for (let step = undo.pop(); step; step = undo.pop()) {
      try {
        await withTimeout(Promise.resolve(step.run()), 20_000, `cleanup: ${step.name}`);
      } catch (error) {
        clean = false;
        progress(`cleanup step "${step.name}" failed: ${describe(error)}`);
      }
    }
    return clean;
  })();
  return cleaning;
}

// ------------------------------------------------------------------------ child processes

export type Received<T extends FromChild['type']> = Extract<FromChild, { type: T }> & {
  receivedAt: number;
};

export interface ChildOptions {
  readonly build: PlainJsBuild;
  readonly root: string;
  readonly signingSecret: string;
  /** When set, the child runs with --cpu-prof into this directory. */
  readonly cpuProfileDir?: string;
  /** More Node options for every child, e.g. `--trace-gc` (not allowed in NODE_OPTIONS). */
  readonly nodeArgs?: readonly string[];
}

/** A forked child: its messages in arrival order, each stamped with its arrival time. */
export class BenchChild {
  private readonly inbox: Array<FromChild & { receivedAt: number }> = [];
  private failure?: Error;
  private stopping = false;
  private wake: () => void = () => {};
  private readonly exited: Promise<void>;
  /** RSS once started (and connected), before any run. */
  idleRssMiB = Number.NaN;

  private constructor(
    private readonly child: ChildProcess,
    readonly label: string,
  ) {
    child.on('message', (message: FromChild) => {
      if (message.type === 'error') {
        this.failure ??= new Error(`${label} failed: ${message.message}`);
      } else {
        this.inbox.push({ ...message, receivedAt: epochMs() });
      }
      this.wake();
    });
    this.exited = new Promise((resolveExit) =>
      child.once('exit', (code, signal) => {
        if (!this.stopping) {
          this.failure ??= new Error(`${label} exited unexpectedly (${code ?? signal})`);
        }
        this.wake();
        resolveExit();
      }),
    );
  }

  static async start(config: ChildConfig, options: ChildOptions): Promise<BenchChild> {
    const label = config.role;
    const execArgv = [...options.build.execArgv];
    if (options.cpuProfileDir) {
      execArgv.push('--cpu-prof', `--cpu-prof-dir=${resolve(options.cpuProfileDir)}`);
      execArgv.push(`--cpu-prof-name=claim-check-${label}-${Date.now()}.cpuprofile`);
    }
    execArgv.push(...(options.nodeArgs ?? []));
    const child = fork(
      options.build.jsOf(join(options.root, 'bench/claim-check.child.ts')),
      [JSON.stringify(config)],
      {
        execArgv,
        // The secret goes by environment, not argv: command lines are world-readable in /proc.
        env: { ...process.env, ...options.build.env, [SIGNING_SECRET_ENV]: options.signingSecret },
        // The child's stdout (Nest logs) goes to our stderr: our stdout is for results.
        stdio: ['ignore', 2, 2, 'ipc'],
      },
    );
    const started = new BenchChild(child, label);
    onCleanup(`stop the ${label}`, () => started.stop());
    const ready = await started.next('ready', 60_000);
    started.idleRssMiB = ready.idleRssMiB;
    progress(`${label}: pid ${ready.pid}, idle RSS ${ready.idleRssMiB} MiB`);
    return started;
  }

  send(message: ToChild): void {
    if (this.failure) throw this.failure;
    this.child.send(message);
  }

  /** The next message of `type`; rejects when the child fails, exits, or on timeout. */
  async next<T extends FromChild['type']>(type: T, timeoutMs: number): Promise<Received<T>> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const index = this.inbox.findIndex((message) => message.type === type);
      if (index >= 0) return this.inbox.splice(index, 1)[0] as Received<T>;
      if (this.failure) throw this.failure;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`${this.label}: no "${type}" within ${timeoutMs} ms`);
      await new Promise<void>((wakeUp) => {
        const timer = setTimeout(wakeUp, left);
        this.wake = () => {
          clearTimeout(timer);
          wakeUp();
        };
      });
    }
  }

  /** Arms the child for a run and waits until it is. */
  async arm(run: string, bytes: number): Promise<void> {
    this.send({ type: 'arm', run, bytes });
    const armed = await this.next('armed', 10_000);
    if (armed.run !== run) throw new Error(`${this.label} armed ${armed.run}, not ${run}`);
  }

  /** Asks it to close and exit; kills it (this one process, by pid) if it does not. */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.stopping = true;
    try {
      if (this.child.connected) this.child.send({ type: 'stop' } satisfies ToChild);
    } catch {
      // already gone
    }
    const stopped = await Promise.race([
      this.exited.then(() => true),
      new Promise<false>((done) => setTimeout(() => done(false), 10_000)),
    ]);
    if (!stopped) {
      progress(`${this.label} did not exit; killing pid ${this.child.pid}`);
      this.child.kill('SIGKILL');
      await this.exited;
    }
  }
}
