import { abortReason, delay } from '../core/async';
import { errorMessage } from '../core/errors/caught';
import { HandlerTimeoutError } from '../core/errors/handler-timeout.error';
import { MessageRefusedError } from '../core/errors/message-refused.error';
import type { RejectionCode } from '../core/errors/rejection-code';
import type { ResolvedRetryPolicy } from '../options/resolved-options';
import {
  callHandler,
  handedOverBy,
  type HandlerContext,
  type HandlerTimeLimit,
} from './handler-call';
import { backoff } from './publish-with-retry';

/**
 * How the calls of one message's handler ended: `ok`, or not, with the last error. `stopped`: the
 * retries were cut short by `hooks.stop` (the module is shutting down): the message was neither
 * handled nor given up on, and goes back to be delivered again (see {@link callHandlerWithRetry}).
 */
export type HandlerOutcome =
  | { readonly ok: true; readonly attempts: number }
  | {
      readonly ok: false;
      readonly attempts: number;
      readonly error: unknown;
      readonly stopped?: boolean;
    };

/**
 * Calls a message handler until it returns, or `policy.attempts` calls have thrown, waiting with
 * exponential backoff in between. `isFinal()` is asked after each failure: true stops at once
 * (wrong bytes, a store that cannot be read: calling the handler again now cannot help). A
 * {@link MessageRefusedError} stops at once too: the handler refused the message for good.
 * With `hooks.limit`, a call that runs past it fails with a {@link HandlerTimeoutError} (see
 * {@link callHandler}): a failed attempt like any other. Once `hooks.limit.until` has aborted
 * (the lease the consumer held the message under is lost), the call that ends then, or the one
 * not made, ends the retries without counting as failed: neither `onFailure` nor the give-up
 * work runs, and the consumer hands the message back. When a failure ends the retries, the
 * `onGiveUp` work its call handed over is awaited before the outcome is returned (and the message
 * dead-lettered). `handsBack()`, asked once a call has ended, says the consumer will hand the
 * message back to be delivered again whatever the outcome (its payload could not be read): the
 * work the call handed over (a reply) is then not run, on success or give-up alike, so that the
 * redelivery's outcome is the only one. Once `hooks.stop` has aborted (the consumers' subscriptions
 * are closing, handing their unsettled messages back), no further call starts: a retry waiting
 * for its backoff ends at once, and a first call not yet made is not made, with a `stopped` outcome, on which the caller neither dead-letters
 * nor records a failure, nor runs the handed-over give-up work: another delivery will call the
 * handler again. Shared by every pattern's consumers.
 */
export async function callHandlerWithRetry(
  call: (context: HandlerContext) => unknown,
  policy: ResolvedRetryPolicy,
  hooks: {
    onFailure(error: unknown, attempt: number): void;
    isFinal(): boolean;
    limit?: HandlerTimeLimit;
    /** Awaited before each call, outside its time limit. */
    beforeCall?(): Promise<void>;
    /** Whether the consumer hands the message back whatever the outcome (see above). */
    handsBack?(): boolean;
    /** Aborted when no further call may start (see above). */
    stop?: AbortSignal;
  },
): Promise<HandlerOutcome> {
  const { attempts, baseDelayMs, maxDelayMs } = policy;
  for (let attempt = 1; ; attempt++) {
    // Aborted before this call (a delivery that reached its handler only after the drain):
    // not called at all, and handed back as if stopped between two attempts.
    if (hooks.stop?.aborted) {
      return { ok: false, attempts: attempt - 1, error: abortReason(hooks.stop), stopped: true };
    }
    let context = undefined as HandlerContext | undefined;
    try {
      await hooks.beforeCall?.();
      // Stopped while it waited (for an abandoned call of the same key to return, say).
      if (hooks.stop?.aborted) {
        return { ok: false, attempts: attempt - 1, error: abortReason(hooks.stop), stopped: true };
      }
      await callHandler(
        (called) => {
          context = called;
          return call(called);
        },
        attempt,
        hooks.limit,
        hooks.handsBack,
      );
      return { ok: true, attempts: attempt };
    } catch (error) {
      if (hooks.limit?.until?.aborted) return { ok: false, attempts: attempt, error };
      const refused = error instanceof MessageRefusedError;
      if (!refused) hooks.onFailure(error, attempt);
      if (refused || attempt >= attempts || hooks.isFinal()) {
        const outcome = { ok: false, attempts: attempt, error } as const;
        if (context && !hooks.handsBack?.()) await handedOverBy(context)?.onGiveUp?.(outcome);
        return outcome;
      }
      await delay(backoff(attempt, baseDelayMs, maxDelayMs), hooks.stop);
      if (hooks.stop?.aborted) return { ok: false, attempts: attempt, error, stopped: true };
    }
  }
}

/**
 * The dead-letter code and detail of a failed handler outcome: the refusal's own when the handler
 * refused the message ({@link MessageRefusedError}), `handler-timeout` when its last call ran
 * past `handlerTimeoutMs`, else `handler-failed` with how many calls failed and the last error,
 * about `what` (`sequence s-1`, `an inline payload`...).
 */
export function handlerRejection(
  what: string,
  outcome: { readonly attempts: number; readonly error: unknown },
): { code: RejectionCode; detail: string } {
  if (outcome.error instanceof MessageRefusedError) {
    return { code: outcome.error.code, detail: `${what}: ${outcome.error.message}` };
  }
  if (outcome.error instanceof HandlerTimeoutError) {
    return {
      code: 'handler-timeout',
      detail:
        `${what}: handler timed out after ${outcome.error.timeoutMs} ms (handlerTimeoutMs) on ` +
        `its last call, after ${outcome.attempts} call(s) failed`,
    };
  }
  return {
    code: 'handler-failed',
    detail: `${what}: handler failed ${outcome.attempts} time(s); last error: ${errorMessage(outcome.error)}`,
  };
}
