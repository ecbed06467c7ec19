/**
 * `nest-sequence/wire`: the wire contract as code, for producers and consumers that do not run
 * the module (another service, a script, a test): fragment headers, claim tickets, the
 * resequencer's and the outbox's headers, and the dead-letter reasons.
 *
 * @module nest-sequence/wire
 */
export {
  SequenceHeader,
  WIRE_VERSION,
  SEQUENCE_ID_PATTERN,
  parseFragmentHeaders,
  buildFragmentHeaders,
  type FragmentHeaderInput,
  type FragmentHeaders,
  type HeaderMap,
  type HeaderValue,
} from './core/headers';
export { crc32, sha256Hex } from './core/checksum';
export { ClaimCheckHeader } from './core/claim-check-headers';
export {
  signTicket,
  verifyTicket,
  checkTicketAudience,
  fragmentAudience,
  FRAGMENT_AUDIENCE_PREFIX,
  parseTicketBody,
  serializeTicket,
  CLAIM_TICKET_VERSION,
  FRAGMENT_TICKET_VERSION,
  ticketFragmentProblem,
  type ClaimTicket,
  type ClaimTicketFields,
  type TicketFragment,
} from './core/claim-ticket';
export { ClaimTicketKeyring, type ClaimTicketKey } from './core/claim-ticket-keyring';
export { ClaimTicketAudienceError } from './core/errors/claim-ticket-audience.error';
export { ResequenceHeader } from './core/resequence-input';
export {
  MESSAGE_ID_HEADER,
  MESSAGE_KIND_HEADER,
  MESSAGE_TYPE_HEADER,
  parseMessage,
} from './outbox/outbox-message.codec';
export { attachOutboxMessageRules } from './outbox/outbox-message.rules';
export { deathReason, type RejectionCode } from './core/errors/rejection-code';
export { REQUEUE_COUNT_HEADER } from './ports/transport.port';
