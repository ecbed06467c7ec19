import { SequenceError } from '../../../../core/errors/sequence.error';
import type { FinalRefusal } from '../../../../ports/transport.port';

/**
 * A publish could be sent again after its stream's `duplicate_window` closed: its `timeoutMs`
 * (how long it resends without a PubAck, with the same `Nats-Msg-Id`) reaches the window, and a
 * resend the stream no longer recognises would be stored a second time. Nothing was sent.
 * Final for a publish's retries (see `isFinalRefusal`): each would be refused the same way.
 */
export class NatsDuplicateWindowError extends SequenceError implements FinalRefusal {
  readonly code = 'duplicate-window-too-short' as const;
  readonly finalRefusal = true as const;

  constructor(
    /** The channel published to. */
    readonly channel: string,
    /** The stream that takes it. */
    readonly stream: string,
    /** The publish's timeout: how long it would be sent again. */
    readonly timeoutMs: number,
    /** The stream's `duplicate_window`, as the server reports it. */
    readonly duplicateWindowMs: number,
  ) {
    super(
      `publish to ${channel}: its timeoutMs (${timeoutMs}) reaches the duplicate_window of ` +
        `stream ${stream} (${duplicateWindowMs} ms), so a resend could be stored twice; nothing ` +
        `was sent. Give the publish a timeoutMs under ${duplicateWindowMs}, or widen the ` +
        `stream's window (\`nats stream edit ${stream} --dupe-window\`)`,
    );
  }
}
