import { SequenceError } from './sequence.error';
import { errorMessage } from './caught';

/**
 * A Claim Check message (a ticket, or a payload sent inline) was not confirmed by the broker
 * within the retry budget. When no attempt can have reached the broker (`maybeDelivered: false`),
 * nothing was delivered: the payload a ticket named was deleted again (or, if that failed too,
 * is left to the orphan sweeper), and sending again is safe. When a confirm timed out
 * (`maybeDelivered: true`) the message may still arrive: the payload is kept until a consumer
 * deletes it or it expires, and sending again may deliver it twice (a new ticket: handled twice).
 */
export class ClaimCheckPublishError extends SequenceError {
  readonly code = 'publish-failed' as const;

  constructor(
    readonly channel: string,
    readonly via: 'inline' | 'ticket',
    readonly attempts: number,
    cause: unknown,
    /** `store:ref` of the payload the ticket named, when there was one. */
    readonly payload?: string,
    /**
     * An attempt may have reached the broker although its confirm never came: the message may
     * still be delivered, and for a ticket the payload was kept (until a consumer deletes it or
     * it expires).
     */
    readonly maybeDelivered: boolean = false,
  ) {
    super(
      `claim check on ${channel}: the ${via === 'ticket' ? `ticket for ${payload}` : 'inline payload'} ` +
        `was not confirmed after ${attempts} attempt(s): ${errorMessage(cause)}`,
      { cause },
    );
  }
}
