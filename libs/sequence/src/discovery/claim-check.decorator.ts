import { handlerDecorator } from './handler-decorator';
import type { ClaimCheckConsumerOptions } from '../options/claim-check.options';

export const CLAIM_CHECK_METADATA = 'nest-sequence:claim-check';

export interface ClaimCheckHandlerOptions extends ClaimCheckConsumerOptions {
  /** The channel (queue) this method consumes: payloads inline or behind tickets. */
  channel: string;
}

/**
 * Marks a provider method as the consumer of a Claim Check channel. It receives every message's
 * payload as a {@link ClaimedPayload}, whether it came inline or behind a ticket (resolved from
 * the payload store and verified as it streams); it never handles a ticket itself. A ticket
 * delivered twice runs it once per channel. If it throws, or runs past `handlerTimeoutMs` (then
 * its second argument's `signal`, see `HandlerContext`, is aborted), it is retried
 * (`handlerRetry`), then the message is dead-lettered.
 *
 * @example
 * @ClaimCheck({ channel: 'imaging.archive', deleteAfter: 'ack', handlerTimeoutMs: 60_000 })
 * async archive(study: ClaimedPayload, { signal }: HandlerContext) {
 *   await pipeline(study.stream(), createWriteStream(path), { signal });
 * }
 */
export const ClaimCheck = (options: ClaimCheckHandlerOptions): MethodDecorator =>
  handlerDecorator('@ClaimCheck', CLAIM_CHECK_METADATA, options);
