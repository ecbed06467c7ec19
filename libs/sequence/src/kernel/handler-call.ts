import { abortReason } from '../core/async';
import type { HandlerTimeoutError } from '../core/errors/handler-timeout.error';

/**
 * What a decorated handler is told besides its message: the second argument of every
 * `@SequencedHandler`, `@ClaimCheck` and `@Resequenced` method (an `@InboxHandler` finds the same
 * `signal` in its `InboxContext`).
 */
export interface HandlerContext {
  /**
   * Aborted when this call runs past `handlerTimeoutMs`, with a `HandlerTimeoutError` as its
   * `reason`, or when the lease it runs under can no longer be shown to be held: a Claim Check
   * ticket's claim, with a `ClaimLeaseLostError`; a store-buffered sequence's completion lease,
   * with a `SequenceLeaseLostError`. Stop, and let go of what the call holds. Whatever the call
   * returns after that is ignored.
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
   * Once aborted, the call is abandoned as if past `ms`, failing with the signal's reason (and
   * no call starts any more): the consumer can no longer go on with the message.
   */
  readonly until?: AbortSignal;
  /**
   * Told of each abandoned call; `settled` resolves (never rejects) once the call has returned
   * or thrown. The Resequencer waits for it before a key's next call.
   */
  abandoned?(settled: Promise<void>): void;
}

/**
 * What a handler call leaves to finish outside its time limit, handed over with
 * {@link handOver}: the microservices integration's replies. Not part of `HandlerContext`.
 */
export interface UntimedWork {
  /**
   * Awaited once the call has returned within its limit, untimed, before the attempt counts as
   * done (so before its message is settled): the publish of a reply, which the limit must not
   * cut short. What it throws fails the attempt.
   */
  afterCall?(): Promise<void>;
  /**
   * Awaited when a failure of the call (its time limit included) ends the retries, before the
   * message is dead-lettered with the same outcome: an error reply. A call past its limit may
   * never return, so it hands this over before its work begins. Resolves, never rejects.
   */
  onGiveUp?(outcome: { readonly attempts: number; readonly error: unknown }): Promise<void>;
  /**
   * Called instead of `afterCall` when it is never run: the call was abandoned (once it has
   * returned), or its message goes back whatever it did. Lets go of what `afterCall` would have
   * used (a stream to reply with). Never throws.
   */
  dropped?(): void;
}

const handedOver = new WeakMap<HandlerContext, UntimedWork>();

/** Hands the kernel work of the call `context` is for, to run outside its time limit. */
export function handOver(context: HandlerContext, work: UntimedWork): void {
  handedOver.set(context, { ...handedOver.get(context), ...work });
}

/** The work the call `context` is for handed over, if any. */
export function handedOverBy(context: HandlerContext): UntimedWork | undefined {
  return handedOver.get(context);
}

/**
 * Makes one handler call with a fresh {@link HandlerContext}. With a limit, a call that has not
 * settled after `limit.ms` is abandoned: its signal is aborted, the attempt throws the limit's
 * error, and the call's late result is dropped (a late rejection is observed, never reported
 * as unhandled). So is one still running when `limit.until` aborts, with its reason; none is
 * made once it has. A call that returns in time is done once the work it handed over
 * ({@link handOver}) is, untimed; an abandoned call's is never run, nor is it when `handsBack()`
 * says, once the call has returned, that the message goes back to be delivered again whatever
 * the call did (its payload could not be read): the call's outcome is not the message's. Its
 * `dropped` is called instead.
 */
export async function callHandler(
  call: (context: HandlerContext) => unknown,
  attempt: number,
  limit?: HandlerTimeLimit,
  handsBack?: () => boolean,
): Promise<void> {
  const controller = new AbortController();
  const context: HandlerContext = { signal: controller.signal, attempt };
  const afterCall = async () => {
    if (handsBack?.()) {
      handedOver.get(context)?.dropped?.();
      return;
    }
    await handedOver.get(context)?.afterCall?.();
  };
  const until = limit?.until;
  if (until?.aborted) throw abortReason(until);
  if (limit === undefined || (limit.ms === undefined && until === undefined)) {
    await call(context);
    await afterCall();
    return;
  }
  const { ms } = limit;
  const running = Promise.resolve().then(() => call(context));
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  const ended = new Promise<Error>((resolve) => {
    if (ms !== undefined) timer = setTimeout(() => resolve(limit.error(attempt)), ms);
    if (until) {
      onAbort = () => resolve(abortReason(until));
      until.addEventListener('abort', onAbort, { once: true });
    }
  });
  let first: 'settled' | Error;
  try {
    first = await Promise.race([running.then(() => 'settled' as const), ended]);
  } finally {
    clearTimeout(timer);
    if (onAbort) until?.removeEventListener('abort', onAbort);
  }
  if (first === 'settled') {
    await afterCall();
    return;
  }
  const error = first;
  controller.abort(error);
  const settled = running.then(
    () => handedOver.get(context)?.dropped?.(),
    () => undefined,
  );
  limit.abandoned?.(settled);
  throw error;
}
