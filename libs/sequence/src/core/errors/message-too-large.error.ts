import { SequenceError } from './sequence.error';

/** A message (body plus headers) is larger than the transport accepts. */
export class MessageTooLargeError extends SequenceError {
  readonly code = 'message-too-large' as const;

  constructor(
    readonly channel: string,
    readonly bytes: number,
    readonly maxMessageBytes: number,
  ) {
    super(
      `a ${bytes}-byte message to ${channel} exceeds the transport's maxMessageBytes ` +
        `(${maxMessageBytes}); lower fragmentBytes or raise the broker's limit`,
    );
  }
}
