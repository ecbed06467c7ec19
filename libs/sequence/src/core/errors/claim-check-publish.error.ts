import { SequenceError } from './sequence.error';

/**
 * A Claim Check message (a ticket, or a payload sent inline) was not confirmed by the broker
 * within the retry budget. For a ticket, the payload it named was deleted again (or, if that
 * failed too, is left to the orphan sweeper): nothing was delivered, and sending again is safe.
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
  ) {
    super(
      `claim check on ${channel}: the ${via === 'ticket' ? `ticket for ${payload}` : 'inline payload'} ` +
        `was not confirmed after ${attempts} attempt(s): ${cause instanceof Error ? cause.message : String(cause)}`,
      { cause },
    );
  }
}
