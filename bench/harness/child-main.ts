/**
 * The child's side of a benchmark child process (child-protocol.ts): reads its configuration,
 * starts its role, says `ready`, hands the parent's messages to the role, and on SIGTERM stops the
 * role and exits 0. Any failure (a thrown error, a rejected promise, an uncaught exception) is
 * sent to the parent and the child exits 1; a child whose parent is gone exits 2. Loads nothing
 * but Node: baseline children (plain amqplib, plain files) must stay free of Nest and the library.
 */
import type { ChildFailure, ChildMessage } from './child-protocol';
import { rssMiB } from './measure';

/** The child's configuration: its only argument, JSON-encoded by the parent. */
export function childConfig<Config>(): Config {
  return JSON.parse(process.argv[2] ?? '{}') as Config;
}

/** How a role talks to its parent. */
export interface ParentLink<FromChild extends ChildMessage> {
  send(message: FromChild): void;
  /** Reports `error` to the parent, then exits 1. */
  fail(error: unknown): void;
}

/** The fields a benchmark adds to its `ready` message (see ChildReady). */
type ReadyExtra<FromChild extends ChildMessage> = Omit<
  Extract<FromChild, { type: 'ready' }>,
  'type' | 'pid' | 'idleRssMiB'
>;

/** What a started role gives the harness. */
export interface ChildRole<ToChild extends ChildMessage, FromChild extends ChildMessage> {
  /** The benchmark's fields of the `ready` message. */
  readonly ready: ReadyExtra<FromChild>;
  /** Carries out one message of the parent; a rejection fails the child. */
  handle(message: ToChild): void | Promise<void>;
  /** Closes what the role opened; called on SIGTERM. */
  stop(): Promise<void>;
}

/** Runs this process as a benchmark child whose role `start` starts. */
export function runChild<ToChild extends ChildMessage, FromChild extends ChildMessage>(
  start: (parent: ParentLink<FromChild>) => Promise<ChildRole<ToChild, FromChild>>,
): void {
  const send = (message: FromChild | ChildFailure) => process.send?.(message);
  let failed = false;
  const fail = (error: unknown) => {
    if (failed) return;
    failed = true;
    const message = error instanceof Error ? (error.stack ?? error.message) : String(error);
    send({ type: 'error', message });
    // Let the IPC message go, then go.
    setTimeout(() => process.exit(1), 100).unref();
  };
  process.on('uncaughtException', fail);
  process.on('unhandledRejection', fail);
  // The parent is gone (crashed or killed): nothing left to report to.
  process.on('disconnect', () => process.exit(2));
  // Ctrl-C reaches the whole process group: the parent's cleanup stops this child.
  process.on('SIGINT', () => undefined);

  let role: ChildRole<ToChild, FromChild> | undefined;
  let stopping: Promise<void> | undefined;
  process.on('SIGTERM', () => {
    // Not started yet: nothing opened is worth closing; the sockets close with the process.
    if (!role) process.exit(0);
    stopping ??= role.stop().then(() => process.exit(0), fail);
  });
  process.on('message', (message: ToChild) => {
    if (stopping || !role) return;
    const started = role;
    Promise.resolve()
      .then(() => started.handle(message))
      .catch(fail);
  });

  const main = async () => {
    role = await start({ send, fail });
    const ready = { type: 'ready', pid: process.pid, idleRssMiB: rssMiB(), ...role.ready };
    send(ready as unknown as FromChild);
  };
  main().catch(fail);
}
