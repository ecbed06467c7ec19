import type { HeaderMap } from '../core/headers';
import { errorMessage } from '../core/errors/caught';
import { PublishRejectedError } from '../core/errors/publish-rejected.error';
import { PublishTimeoutError } from '../core/errors/publish-timeout.error';
import { delay, withTimeout } from '../core/async';
import {
  isFinalRefusal,
  isUnsendable,
  type PublishOptions,
  type Transport,
} from '../ports/transport.port';
import type { ResolvedPublishPolicy } from '../options/resolved-options';
import { withTraceHeaders } from './tracing/message-spans';

/**
 * Publishes one message and waits for the broker's confirm, retrying with exponential backoff and
 * jitter. The timeout is enforced here too, so a transport that never answers cannot hang a send.
 * Reports the last error once `attempts` are spent; a message no retry can send (`isUnsendable`:
 * too large, or headers the transport cannot encode; a reply whose reply channel is closed) is
 * not retried, nor a publish the transport refused before sending for its configuration
 * (`isFinalRefusal`): its error is reported at once. `mayAttempt`, when given, is asked before
 * each attempt with the longest the attempt may take, and before each backoff with that wait
 * added: false ends the retries there (a resequencer's drain lease that would lapse before the
 * confirm, a module that stops).
 */
export async function publishWithRetry(
  transport: Transport,
  channel: string,
  body: Buffer,
  headers: HeaderMap,
  policy: ResolvedPublishPolicy,
  mayAttempt: (timeoutMs: number) => boolean = () => true,
  /** Where on a partitioned channel (see `Transport.partitioned`); undefined: the channel. */
  partition?: PublishOptions['partition'],
  /** Ends a backoff early once aborted (`mayAttempt` then decides whether to go on). */
  signal?: AbortSignal,
): Promise<PublishOutcome> {
  let attempt = 0;
  let maybeDelivered = false;
  let lastError: unknown;
  const stopped = (): PublishOutcome => {
    const error = new Error(
      `no further attempt to publish to ${channel}: it could not be confirmed in time` +
        (lastError === undefined ? '' : ` (last error: ${errorMessage(lastError)})`),
    );
    return { ok: false, attempts: attempt, error, maybeDelivered };
  };
  for (;;) {
    if (!mayAttempt(policy.confirmTimeoutMs)) return stopped();
    attempt++;
    try {
      await publishOnce(transport, channel, body, headers, {
        timeoutMs: policy.confirmTimeoutMs,
        ...(partition && { partition }),
      });
      return { ok: true, attempts: attempt };
    } catch (error) {
      maybeDelivered ||= mayHaveReachedTheBroker(error);
      lastError = error;
      if (
        isUnsendable(error) ||
        isFinalRefusal(error) ||
        replyChannelGone(transport, channel, error) ||
        attempt >= policy.retry.attempts
      ) {
        return { ok: false, attempts: attempt, error, maybeDelivered };
      }
      const waitMs = backoff(attempt, policy.retry.baseDelayMs, policy.retry.maxDelayMs);
      // Asked before the wait too, with the wait counted: no backoff for an attempt never made.
      if (!mayAttempt(waitMs + policy.confirmTimeoutMs)) return stopped();
      await delay(waitMs, signal);
    }
  }
}

/**
 * One publish attempt, its `timeoutMs` enforced here too: a transport that never answers cannot
 * hang it (it rejects with `PublishTimeoutError`). The active span's trace context goes into the
 * headers (see `withTraceHeaders`).
 */
export function publishOnce(
  transport: Transport,
  channel: string,
  body: Buffer,
  headers: HeaderMap,
  options: PublishOptions & { readonly timeoutMs: number },
): Promise<void> {
  // Called at once, as the async wrapper runs up to its first await; a transport that throws
  // instead of rejecting is one failed attempt, never an exception out of a caller that has
  // other publishes in flight.
  const sent = (async () => transport.publish(channel, body, withTraceHeaders(headers), options))();
  return withTimeout(
    sent,
    options.timeoutMs,
    () => new PublishTimeoutError(channel, options.timeoutMs),
  );
}

export type PublishOutcome =
  | { readonly ok: true; readonly attempts: number }
  | {
      readonly ok: false;
      readonly attempts: number;
      readonly error: unknown;
      /** Some attempt may have reached the broker although unconfirmed (e.g. a confirm timeout). */
      readonly maybeDelivered: boolean;
    };

/**
 * Whether `error` says that `channel`, a reply channel, is closed: the transport refuses a
 * publish to one only once its requester closed it or is gone (see `Transport.openReplyChannel`),
 * and it is never opened again. Retrying would only hold the request being answered.
 */
export function replyChannelGone(transport: Transport, channel: string, error: unknown): boolean {
  return error instanceof PublishRejectedError && transport.isReplyChannel?.(channel) === true;
}

/**
 * A confirm that did not come in time says nothing about whether the broker has the message;
 * any other failure (a refusal before sending, the broker's nack, a transport error) says it
 * does not.
 */
export function mayHaveReachedTheBroker(error: unknown): boolean {
  return error instanceof PublishTimeoutError && error.maybeSent;
}

/** base × 2^(attempt-1), capped, with "equal jitter" (half fixed, half random). */
export function backoff(attempt: number, baseDelayMs: number, maxDelayMs: number): number {
  // The exponent is capped so that huge attempt counts stay finite (0 × Infinity is NaN).
  const ceiling = Math.min(maxDelayMs, baseDelayMs * 2 ** Math.min(attempt - 1, 52));
  return ceiling / 2 + Math.random() * (ceiling / 2);
}
