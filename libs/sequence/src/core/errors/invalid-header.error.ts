import { SequenceError } from './sequence.error';

/**
 * A message's headers cannot be sent by this transport as they are (an AMQP header name over 255
 * bytes, a number AMQP cannot carry, headers too large to encode). Nothing was sent; sending the
 * same headers again fails the same way.
 */
export class InvalidHeaderError extends SequenceError {
  readonly code = 'invalid-header' as const;

  constructor(
    readonly channel: string,
    /** The header at fault; empty when the headers as a whole are. */
    readonly header: string,
    readonly problem: string,
  ) {
    super(
      `a message to ${channel} cannot be sent: ${header ? `header ${header} ` : 'its headers '}` +
        `${problem}`,
    );
  }
}
