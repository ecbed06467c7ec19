import { SequenceError } from './sequence.error';

/**
 * Why `subscribe` gave up before consuming:
 * - `channel-not-opened`: the subscriber's channel could not be opened (refused by the broker, no
 *   channel number left on the connection, or the connection lost while it opened);
 * - `timeout`: not consuming within the transport's `subscribeTimeoutMs`;
 * - `closed`: the subscription or its transport was closed first.
 */
export type SubscribeFailure = 'channel-not-opened' | 'timeout' | 'closed';

/** `subscribe` did not start consuming: nothing consumes for it, and subscribing again is safe. */
export class SubscribeError extends SequenceError {
  readonly code = 'subscribe-failed' as const;

  constructor(
    readonly channel: string,
    readonly reason: SubscribeFailure,
    detail: string,
    cause?: unknown,
  ) {
    super(`subscribe to ${channel} failed (${reason}): ${detail}`, { cause });
  }
}
