import { SequenceError } from './sequence.error';

/**
 * Why a claim ticket was refused. Each is final for that message (no retry can fix it), so the
 * message is dead-lettered with the reason, never requeued.
 */
export type ClaimTicketInvalidReason =
  /** Not a ticket of this library's format: bad JSON, too large, a field missing or out of range. */
  | 'malformed'
  /** No signature at all. Every ticket this library writes is signed. */
  | 'unsigned'
  /** The signature does not match the fields: tampered with, or signed by another secret. */
  | 'bad-signature'
  /** Signed with a key id this side does not hold (rotated out too early, or never shared). */
  | 'unknown-key'
  /** Validly signed, but past its `expiresAt`: its payload may already be swept. */
  | 'expired'
  /**
   * Validly signed by an earlier release, whose tickets name no channel, on a consumer that
   * takes only tickets issued for its channel (`claimCheck.acceptTicketsWithoutAudience` off).
   */
  | 'no-audience';

const ADVICE: Record<ClaimTicketInvalidReason, string> = {
  malformed: 'the message is not a claim ticket of this version',
  unsigned: 'only signed tickets are accepted',
  'bad-signature':
    'the ticket was altered after signing, or sender and receiver hold different secrets under one key id',
  'unknown-key':
    "add the key to this side's claim-check keys (keep retired keys listed until their tickets expire)",
  expired: 'it outlived its ttl; raise the ttl if consumers lag this far behind',
  'no-audience':
    'upgrade its producer; while tickets of older producers drain, set ' +
    'claimCheck.acceptTicketsWithoutAudience on this consumer',
};

/** A claim ticket failed validation, its signature check, or its expiry check. */
export class ClaimTicketInvalidError extends SequenceError {
  readonly code = 'claim-ticket-invalid' as const;

  constructor(
    readonly reason: ClaimTicketInvalidReason,
    /** What exactly is wrong, e.g. which field. Never contains a secret or a signature. */
    readonly detail: string,
    /** The ticket's key id, when it could be read. */
    readonly kid?: string,
  ) {
    super(
      `claim ticket refused (${reason}): ${detail}${kid === undefined ? '' : ` (key id ${JSON.stringify(kid)})`}; ${ADVICE[reason]}`,
    );
  }
}
