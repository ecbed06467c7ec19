import { SequenceError } from './sequence.error';

/** The transport did not confirm a publish within `confirmTimeoutMs`. */
export class PublishTimeoutError extends SequenceError {
  readonly code = 'publish-timeout' as const;

  constructor(
    readonly channel: string,
    readonly timeoutMs: number,
    /**
     * `false` when the time ran out before the message was handed to the broker connection
     * (waiting for a connection or for the queue's declaration): the broker cannot have it.
     * `true` otherwise: it may have reached the broker, only its confirm is missing.
     */
    readonly maybeSent: boolean = true,
    /** Why it ended before `timeoutMs` (a publish that may not be sent again lost its channel). */
    why?: string,
  ) {
    super(
      why === undefined
        ? `publish to ${channel} was not confirmed within ${timeoutMs} ms`
        : `publish to ${channel} was not confirmed: ${why}`,
    );
  }
}
