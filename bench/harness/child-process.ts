/**
 * The parent's side of a benchmark child process (child-protocol.ts): forks a child from the
 * plain-JavaScript build (so that its memory is its own, without ts-node's compiler), keeps its
 * messages in arrival order stamped with their arrival time, waits for the next one of a type,
 * and stops it: SIGTERM, then SIGKILL after a grace period. A stop step is registered with the
 * cleanup as soon as the child is forked.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import { onCleanup } from './cleanup';
import type { ChildFailure, ChildMessage } from './child-protocol';
import { progress } from './log';
import { epochMs, type EpochMs } from './measure';
import type { PlainJsBuild } from './plain-js-build';

export interface ChildOptions {
  /** Names the child in errors and progress lines (`raw 8MiB`, `receiver`, ...). */
  readonly label: string;
  /** The child's entry: a TypeScript file of the project, run from `build`. */
  readonly entry: string;
  readonly build: PlainJsBuild;
  /** The child's only argument, JSON-encoded. */
  readonly config: unknown;
  /** Set in the child's environment on top of this process's (secrets go here, not in argv). */
  readonly env?: Readonly<Record<string, string>>;
  /** More Node options, e.g. `--trace-gc` (not all are allowed in NODE_OPTIONS). */
  readonly nodeArgs?: readonly string[];
  /** When set, the child runs with --cpu-prof into this directory. */
  readonly cpuProfileDir?: string;
  /** How long it may take to send `ready` (default 60 s). */
  readonly readyTimeoutMs?: number;
  /** How long it may take to exit after SIGTERM before it is killed (default 10 s). */
  readonly stopGraceMs?: number;
}

/** How a child ended. */
export interface ChildExit {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
}

/** A message as received: stamped with when it arrived. */
export type Received<M extends ChildMessage, T extends M['type']> = Extract<M, { type: T }> & {
  readonly receivedAt: EpochMs;
};

/** A forked child speaking `ToChild` and `FromChild` (which has a `ready`) over IPC. */
export class BenchChild<ToChild extends ChildMessage, FromChild extends ChildMessage> {
  private readonly inbox: Array<FromChild & { receivedAt: EpochMs }> = [];
  private failure?: Error;
  private stopping = false;
  private stopped?: Promise<ChildExit>;
  private wake: () => void = () => {};
  private readonly exited: Promise<ChildExit>;
  /** Its `ready` message. */
  ready!: Received<FromChild, 'ready'>;

  private constructor(
    private readonly child: ChildProcess,
    readonly label: string,
  ) {
    child.on('message', (message: FromChild | ChildFailure) => {
      if (message.type === 'error') {
        this.failure ??= new Error(`${label} failed: ${(message as ChildFailure).message}`);
      } else {
        this.inbox.push({ ...(message as FromChild), receivedAt: epochMs() });
      }
      this.wake();
    });
    this.exited = new Promise((resolveExit) =>
      child.once('exit', (code, signal) => {
        if (!this.stopping) {
          this.failure ??= new Error(`${label} exited unexpectedly (${code ?? signal})`);
        }
        this.wake();
        resolveExit({ code, signal });
      }),
    );
  }

  /** Forks the child and waits for its `ready`. */
  static async start<ToChild extends ChildMessage, FromChild extends ChildMessage>(
    options: ChildOptions,
  ): Promise<BenchChild<ToChild, FromChild>> {
    const execArgv = [...options.build.execArgv];
    if (options.cpuProfileDir) {
      execArgv.push('--cpu-prof', `--cpu-prof-dir=${resolve(options.cpuProfileDir)}`);
      const name = options.label.replace(/\W+/g, '-');
      execArgv.push(`--cpu-prof-name=${name}-${Date.now()}.cpuprofile`);
    }
    execArgv.push(...(options.nodeArgs ?? []));
    const forked = fork(options.build.jsOf(options.entry), [JSON.stringify(options.config)], {
      execArgv,
      env: { ...process.env, ...options.build.env, ...options.env },
      // The child's stdout (Nest logs) goes to our stderr: our stdout is for results.
      stdio: ['ignore', 2, 2, 'ipc'],
    });
    const child = new BenchChild<ToChild, FromChild>(forked, options.label);
    onCleanup(`stop the ${options.label} child`, async () => {
      await child.stop(options.stopGraceMs);
    });
    child.ready = await child.next('ready', options.readyTimeoutMs ?? 60_000);
    return child;
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  send(message: ToChild): void {
    if (this.failure) throw this.failure;
    this.child.send(message);
  }

  /** The next message of `type`; rejects when the child fails, exits, or on timeout. */
  async next<T extends FromChild['type']>(
    type: T,
    timeoutMs: number,
  ): Promise<Received<FromChild, T>> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const index = this.inbox.findIndex((message) => message.type === type);
      if (index >= 0) return this.inbox.splice(index, 1)[0] as Received<FromChild, T>;
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

  /**
   * Stops the child: SIGTERM, then SIGKILL (this one process, by pid) if it has not exited after
   * `graceMs`. Resolves with how it ended; rejects when it did not end cleanly (exit code 0) of
   * its own accord after SIGTERM. A child that had already exited is left as it was (its failure,
   * if any, was reported to whatever waited for it).
   */
  stop(graceMs = 10_000): Promise<ChildExit> {
    this.stopped ??= this.terminate(graceMs);
    return this.stopped;
  }

  private async terminate(graceMs: number): Promise<ChildExit> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return this.exited;
    this.stopping = true;
    this.child.kill('SIGTERM');
    let timer: NodeJS.Timeout | undefined;
    const exit = await Promise.race([
      this.exited,
      new Promise<undefined>((done) => (timer = setTimeout(() => done(undefined), graceMs))),
    ]);
    clearTimeout(timer);
    if (exit === undefined) {
      progress(
        `${this.label} did not exit within ${graceMs} ms of SIGTERM; killing pid ${this.pid}`,
      );
      this.child.kill('SIGKILL');
      const killed = await this.exited;
      throw new Error(`${this.label} had to be killed (${killed.signal ?? killed.code})`);
    }
    if (exit.code !== 0) {
      throw new Error(`${this.label} stopped with ${exit.signal ?? `exit code ${exit.code}`}`);
    }
    return exit;
  }
}
