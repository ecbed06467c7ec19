import { SequenceError } from './sequence.error';

/**
 * Why a handler refused a message for good, as its `x-death-reason` code says:
 * - `no-handler`: nothing in this application handles the message's pattern;
 * - `undecodable`: its payload cannot be decoded as its content type says;
 * - `forbidden`: a guard refused it;
 * - `invalid-payload`: a pipe (validation) refused it;
 * - `sequence-too-large`: a streamed sequence's fragments passed `maxSequenceBytes`;
 * - `position-out-of-range`: a streamed fragment past its sequence's last one.
 */
export type RefusalCode =
  | 'no-handler'
  | 'undecodable'
  | 'forbidden'
  | 'invalid-payload'
  | 'sequence-too-large'
  | 'position-out-of-range';

/**
 * Thrown by a handler to refuse a message for good: it is not retried, and it is dead-lettered
 * with `code` and this message as its reason. Anything else a handler throws is retried per
 * `handlerRetry`, then dead-lettered `handler-failed`.
 */
export class MessageRefusedError extends SequenceError {
  constructor(
    readonly code: RefusalCode,
    detail: string,
    options?: { cause?: unknown },
  ) {
    super(detail, options);
  }
}
