/**
 * Timing helpers shared by the library and its adapters. Timers only: no I/O.
 */

import { leaseClock, msSince } from './lease-clock';

/** The longest delay a Node timer takes (about 24.8 days); a longer one fires after 1 ms. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Resolves after `ms` milliseconds, at most {@link MAX_TIMER_MS} (a computed backoff past it would
 * otherwise fire after 1 ms); at once, its timer cleared, when `signal` aborts first.
 */
export function delay(ms: number, signal?: AbortSignal): Promise<void> {
  if (!signal) return new Promise((resolve) => setTimeout(resolve, Math.min(ms, MAX_TIMER_MS)));
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, Math.min(ms, MAX_TIMER_MS));
    signal.addEventListener('abort', done, { once: true });
  });
}

/**
 * Calls `attempt` until it resolves: after a failure it waits 50 ms, then twice as long each time
 * (at most 2 s), and calls again. Rethrows the last error once the next wait would end more than
 * `withinMs` after the first call, or once `stopped()` says so or `signal` aborts (which also
 * ends a wait at once). `onRetry` hears each error about to be retried, with the wait before the
 * next call.
 */
export async function retryWithin<T>(
  attempt: () => Promise<T>,
  withinMs: number,
  options: {
    readonly stopped?: () => boolean;
    readonly signal?: AbortSignal;
    readonly onRetry?: (error: unknown, waitMs: number) => void;
  } = {},
): Promise<T> {
  const { signal } = options;
  // On both clocks: callers bound this by a lease, which a wall clock stepped back (or a
  // monotonic one stopped while the machine was suspended) would outlast.
  const started = leaseClock();
  for (let waitMs = RETRY_FIRST_MS; ; waitMs = Math.min(waitMs * 2, RETRY_MAX_MS)) {
    try {
      return await attempt();
    } catch (error) {
      const over = () => options.stopped?.() || signal?.aborted === true;
      if (over() || msSince(started) + waitMs > withinMs) throw error;
      options.onRetry?.(error, waitMs);
      await delay(waitMs, signal);
      if (over()) throw error;
    }
  }
}

const RETRY_FIRST_MS = 50;
const RETRY_MAX_MS = 2_000;

/**
 * Settles as `promise` does, unless `ms` milliseconds pass first: then rejects with `onTimeout()`.
 * `promise` stays observed after the timeout, so its late rejection is not reported as unhandled.
 * The timer is cleared as soon as `promise` settles.
 */
export async function withTimeout<T>(
  promise: Promise<T>,
  ms: number,
  onTimeout: () => Error,
): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(onTimeout()), Math.max(0, ms));
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Whether `promise` settles (resolved or rejected) within `ms` milliseconds, at most
 * {@link MAX_TIMER_MS}: for a shutdown that waits for work in progress, but not for ever. The
 * timer is cleared as soon as `promise` settles.
 */
export async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  return withTimeout(
    promise.then(
      () => true,
      () => true,
    ),
    Math.min(ms, MAX_TIMER_MS),
    () => new Error('still running'),
  ).catch(() => false);
}

/** How long a connection's polite close (Redis's `QUIT`, PostgreSQL's terminate) is waited for. */
export const POLITE_CLOSE_MS = 2_000;

/**
 * Closes a connection politely (`close`), and drops it (`drop`) when that fails or does not end
 * within {@link POLITE_CLOSE_MS}: a server that stopped answering never confirms a close, and the
 * socket would stay open, keeping the process alive, for as long as the operating system keeps it.
 */
export async function closeOrDrop(close: () => Promise<unknown>, drop: () => void): Promise<void> {
  const closed = (async () => close())().then(
    () => true,
    () => false,
  );
  if (!(await settlesWithin(closed, POLITE_CLOSE_MS)) || !(await closed)) drop();
}

/**
 * A clock that reads `now` at first and moves on with real time: for a sweep given the time it
 * runs at (tests give a later one), whose later steps must see the time it has taken.
 */
export function clockFrom(now: number): () => number {
  const began = Date.now();
  return () => now + (Date.now() - began);
}

/**
 * `start`, called at most once at a time: while the promise of a call is pending, callers get
 * that promise instead of a new call (a read that outlived its caller's timeout, say, is waited
 * on again rather than joined by more reads of a slow server).
 */
export function oneAtATime<T>(start: () => Promise<T>): () => Promise<T> {
  let running: Promise<T> | undefined;
  return () => {
    if (!running) {
      // Called at once; a `start` that throws before it returns a promise rejects, like any.
      const current = (async () => start())();
      running = current;
      const done = () => {
        if (running === current) running = undefined;
      };
      current.then(done, done);
    }
    return running;
  };
}

/** An aborted signal's reason as an Error (an `abort()` without one gives an `AbortError`). */
export function abortReason(signal: AbortSignal): Error {
  const reason: unknown = signal.reason;
  return reason instanceof Error ? reason : new Error(`aborted: ${String(reason)}`);
}

/**
 * `promise`, unless `signal` aborts first: then a rejection with the signal's reason (the work
 * behind `promise` goes on; its outcome is dropped). For a wait on a service that cannot be
 * cancelled, by a caller that no longer wants its answer.
 */
export function unlessAborted<T>(promise: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return promise;
  if (signal.aborted) {
    promise.catch(() => undefined);
    return Promise.reject(abortReason(signal));
  }
  return new Promise<T>((resolve, reject) => {
    const abandon = () => reject(abortReason(signal));
    signal.addEventListener('abort', abandon, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener('abort', abandon);
        resolve(value);
      },
      (error: Error) => {
        signal.removeEventListener('abort', abandon);
        reject(error);
      },
    );
  });
}
