import { SequenceError } from './sequence.error';

/**
 * A validly signed claim ticket was taken on a channel it was not issued for: replayed from
 * another channel, or routed to the wrong queue. Final for that message: it is dead-lettered
 * `wrong-audience` before its payload or the claim ledger is touched.
 */
export class ClaimTicketAudienceError extends SequenceError {
  readonly code = 'wrong-audience' as const;

  constructor(
    /** The payload the ticket names, as `<store>:<ref>`. */
    readonly ticket: string,
    /** The channel that took the ticket. */
    readonly channel: string,
    /** The channels the ticket was issued for (signed into it). */
    readonly audience: readonly string[],
    /** The ticket's key id. */
    readonly kid?: string,
  ) {
    const issuedFor =
      audience.length === 0
        ? 'no channel (checked in for checkOut by hand)'
        : audience.map((name) => JSON.stringify(name)).join(', ');
    super(
      `claim ticket ${ticket} was issued for ${issuedFor}, not for ${JSON.stringify(channel)}; ` +
        'publish it to a channel it was issued for, or check the payload in with this channel ' +
        'in its audience',
    );
  }
}
