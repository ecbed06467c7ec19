import type { HandlerTimeoutError } from '../core/errors/handler-timeout.error';

/**
 * What a decorated handler is told besides its message: the second argument of every
 * `@SequencedHandler`, `@ClaimCheck` and `@Resequenced` method (an `@InboxHandler` finds the same
 * `signal` in its `InboxContext`).
 */
export interface HandlerContext {
  /**
   * Aborted when this call runs past `handlerTimeoutMs`, with a `HandlerTimeoutError` as its
   * `reason`: stop, and let go of what the call holds. Whatever the call returns after that is
   * ignored. Never aborted when no limit is set.
   */
  readonly signal: AbortSignal;
  /** 1 on the first call for this message; one more at each retry. */
  readonly attempt: number;
}

/** A handler's time limit, as a pattern's consumer applies it to each call. */
export interface HandlerTimeLimit {
  /** Longest a call may run; `undefined`: no limit. */
  readonly ms: number | undefined;
  /** The error an attempt that ran past `ms` fails with. */
  error(attempt: number): HandlerTimeoutError;
  /**
   * Told of each abandoned call; `settled` resolves (never rejects) once the call has returned
   * or thrown. The Resequencer waits for it before a key's next call.
   */
  abandoned?(settled: Promise<void>): void;
}

/**
 * Makes one handler call with a fresh {@link HandlerContext}. With a limit, a call that has not
 * settled after `limit.ms` is abandoned: its signal is aborted, the attempt throws the limit's
 * error, and the call's late result is dropped (a late rejection is observed, never reported
 * as unhandled).
 */
export async function callHandler(
  call: (context: HandlerContext) => unknown,
  attempt: number,
  limit?: HandlerTimeLimit,
): Promise<void> {
  const controller = new AbortController();
  const context: HandlerContext = { signal: controller.signal, attempt };
  if (limit?.ms === undefined) {
    await call(context);
    return;
  }
  const running = Promise.resolve().then(() => call(context));
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<'expired'>((resolve) => {
    timer = setTimeout(() => resolve('expired'), limit.ms);
  });
  try {
    const first = await Promise.race([running.then(() => 'settled' as const), expired]);
    if (first === 'settled') return;
  } finally {
    clearTimeout(timer);
  }
  const error = limit.error(attempt);
  controller.abort(error);
  const settled = running.then(
    () => undefined,
    () => undefined,
  );
  limit.abandoned?.(settled);
  throw error;
}
