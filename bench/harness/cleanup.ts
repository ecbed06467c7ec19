/**
 * One registry of cleanup steps per benchmark process. Whatever a benchmark creates outside itself
 * (a child process, a queue, Redis keys, a table, a temporary directory, an open connection)
 * registers how to remove it as soon as it exists. The steps run once each, last registered first,
 * however the benchmark ends: normally, on an error, on SIGINT (Ctrl-C) or SIGTERM, or on an
 * uncaught exception or unhandled rejection. A step that is done early (a round's queue deleted
 * when the round ends) runs then and leaves the registry.
 */
import { describeError, progress, setProgressTag } from './log';

/** How long one step may take before the cleanup gives up on it and goes on. */
const STEP_TIMEOUT_MS = 20_000;

/** A registered step. */
export interface CleanupStep {
  /** Runs the step now, if it has not run yet, and takes it off the registry. */
  run(): Promise<void>;
}

interface Entry {
  readonly name: string;
  readonly run: () => Promise<void> | void;
  done?: Promise<void>;
}

const registry: Entry[] = [];
let cleaning: Promise<boolean> | undefined;

/** Registers `run` as the way to undo `name`; it runs at the latest when the benchmark ends. */
export function onCleanup(name: string, run: () => Promise<void> | void): CleanupStep {
  const entry: Entry = { name, run };
  registry.push(entry);
  return { run: () => runEntry(entry) };
}

function runEntry(entry: Entry): Promise<void> {
  const index = registry.indexOf(entry);
  if (index >= 0) registry.splice(index, 1);
  entry.done ??= withTimeout(
    Promise.resolve().then(entry.run),
    STEP_TIMEOUT_MS,
    `cleanup: ${entry.name}`,
  );
  return entry.done;
}

/** Runs every step still registered, last first; resolves whether all of them succeeded. */
export function cleanUp(): Promise<boolean> {
  cleaning ??= (async () => {
    let clean = true;
    for (let entry = registry.at(-1); entry; entry = registry.at(-1)) {
      try {
        await runEntry(entry);
      } catch (error) {
        clean = false;
        progress(`cleanup step "${entry.name}" failed: ${describeError(error)}`);
      }
    }
    return clean;
  })();
  return cleaning;
}

/** Rejects with a timeout error when `promise` has not settled within `ms`. */
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

let exitCode: number | undefined;
let signalled = false;

/**
 * Ends the process once the cleanup has run: with `code`, or 1 for a clean end whose cleanup
 * failed. The first call starts the cleanup and decides the code; a signal while it runs makes
 * the code the signal's, and a second signal exits at once.
 */
function finish(code: number, signal?: NodeJS.Signals): void {
  if (exitCode !== undefined) {
    if (!signal) return;
    if (signalled) {
      progress(`${signal} again: exiting without waiting for the cleanup`);
      process.exit(exitCode);
    }
    signalled = true;
    exitCode = code;
    progress(`${signal} while cleaning up; once more to exit at once`);
    return;
  }
  signalled = signal !== undefined;
  exitCode = code;
  void cleanUp().then((clean) => process.exit(exitCode || (clean ? 0 : 1)));
}

/**
 * Runs a benchmark's `main`: progress lines tagged with `name`, the cleanup steps run whatever
 * happens, and the exit code says how it went: 0 done and clean; 1 an error (or a failed
 * cleanup); 130 interrupted (SIGINT); 143 terminated (SIGTERM). Once the benchmark is stopping,
 * errors of the work still under way (its connections closing under it) are not news.
 */
export function runBench(name: string, main: () => Promise<void>): void {
  setProgressTag(name);
  const fail = (error: unknown) => {
    if (exitCode !== undefined) return;
    console.error(error);
    finish(1);
  };
  process.on('SIGINT', () => {
    if (exitCode === undefined) progress('interrupted; cleaning up');
    finish(130, 'SIGINT');
  });
  process.on('SIGTERM', () => {
    if (exitCode === undefined) progress('terminated; cleaning up');
    finish(143, 'SIGTERM');
  });
  process.on('uncaughtException', fail);
  process.on('unhandledRejection', fail);
  main().then(() => finish(0), fail);
}
