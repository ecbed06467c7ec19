import { replaceLoneSurrogates } from '../unicode';

/**
 * Why a fragment or a whole sequence was refused. These codes travel in the `x-death-reason`
 * header of dead-lettered messages (as `<code>: <detail>`), so they are part of the public contract.
 */
export type RejectionCode =
  /** A wire-contract header is missing, has the wrong type, or is out of range. */
  | 'malformed-header'
  /** `x-sequence-version` names a version this library does not speak. */
  | 'unsupported-version'
  /** The fragment body does not match its `x-fragment-crc32`. */
  | 'crc-mismatch'
  /** The fragment body is larger than the consumer accepts for one fragment. */
  | 'fragment-too-large'
  /** The fragment's user headers are larger than the consumer keeps (`maxHeaderBytes`). */
  | 'headers-too-large'
  /** The position is beyond the size this sequence declared. */
  | 'position-out-of-range'
  /** `x-sequence-size` differs from the size an earlier fragment declared. */
  | 'size-changed'
  /** A second fragment claims to be the last one, at another position. */
  | 'duplicate-last'
  /** Same (id, position) as a stored fragment, but a different body. */
  | 'conflicting-duplicate'
  /** `x-sequence-bytes` or `x-sequence-sha256` differs from what an earlier fragment declared. */
  | 'declaration-changed'
  /** The sequence exceeds `maxSequenceBytes`. */
  | 'sequence-too-large'
  /** The sequence exceeds `maxFragments`. */
  | 'too-many-fragments'
  /** The reassembled payload does not match `x-sequence-sha256` or `x-sequence-bytes`. */
  | 'integrity-mismatch'
  /** A fragment arrived for a sequence that was rejected earlier. */
  | 'sequence-rejected'
  /** A fragment arrived for a sequence that expired earlier, or the expiry record itself. */
  | 'sequence-expired'
  /** The handler kept failing after its retries. */
  | 'handler-failed'
  /** The handler's last call ran past `handlerTimeoutMs` (the calls before it failed or timed out too). */
  | 'handler-timeout'
  /**
   * Claim Check: the ticket is malformed, unsigned, badly signed, under an unknown key, expired,
   * or names no channel where one is required.
   */
  | 'claim-ticket-invalid'
  /**
   * Claim Check: a validly signed ticket arrived on a channel it was not issued for (replayed or
   * misrouted); its payload and the claim ledger were left untouched.
   */
  | 'wrong-audience'
  /** Claim Check: the ticket names a payload store this consumer is not configured with. */
  | 'unknown-payload-store'
  /** Claim Check: the payload the ticket names is gone (released, swept) or never was. */
  | 'claim-check-not-found'
  /**
   * Claim Check: the payload store or claim ledger failed on a message requeued `maxStoreRequeues`
   * times: a ticket's, or a fragment's sent `via: 'claim-check'` (its parked body unreadable).
   * Inbox: the inbox table refused the message's record as often. (Broker-held reassembly: its
   * spool failed on every read back of the sequence.)
   */
  | 'store-unavailable'
  /** Resequencer: the event's key or sequence number is missing or invalid, or below `start`. */
  | 'invalid-resequence-event'
  /**
   * Resequencer: buffering the event would pass a bound (`overflow: 'dead-letter'`), or, larger
   * than a byte bound on its own, it waited `gap.timeoutMs` for the events before it.
   */
  | 'resequencer-buffer-full'
  /** Resequencer: a gap stayed open past its timeout (policy `'alert'`): a record, not an event. */
  | 'resequencer-gap-alert'
  /** Resequencer: sequences were given up (policy `'skip'`): a record, not an event. */
  | 'resequencer-gap-skipped'
  /** Resequencer: a buffered event was moved out, unreleased (policy `'dead-letter'`). */
  | 'resequencer-gap-dead-letter'
  /**
   * Resequencer: the transport can never send the released event to `output` (too large with
   * its output headers, or headers it cannot encode): dead-lettered so that its key moves on.
   */
  | 'resequencer-output-unsendable'
  /** Inbox: the message is not a valid event or command (body, headers or fields). */
  | 'invalid-inbox-message'
  /** Inbox: no `@InboxHandler` of this application handles the message's type. */
  | 'no-inbox-handler'
  /** Microservices: no `@EventPattern` or `@MessagePattern` handles the message's pattern. */
  | 'no-handler'
  /** Microservices: the payload cannot be decoded as its content type says (JSON that does not parse). */
  | 'undecodable'
  /** Microservices: a guard refused the message. */
  | 'forbidden'
  /** Microservices: a pipe refused the payload (validation); the reason lists its messages. */
  | 'invalid-payload';

/**
 * Longest `x-death-reason`, in characters: the detail may quote a handler's error message, and
 * the header must leave room for the message's own headers in a dead letter.
 */
export const MAX_DEATH_REASON_CHARS = 1_024;

/** Formats the `x-death-reason` header value for a rejection (cut at MAX_DEATH_REASON_CHARS). */
export function deathReason(code: RejectionCode, detail: string): string {
  // A lone surrogate (from a handler's error message) is written as U+FFFD, as UTF-8 carries it.
  const reason = replaceLoneSurrogates(`${code}: ${detail}`);
  if (reason.length <= MAX_DEATH_REASON_CHARS) return reason;
  let end = MAX_DEATH_REASON_CHARS - 1;
  // Not between the two halves of one character (an emoji), which would leave half of it.
  if (isHighSurrogate(reason.charCodeAt(end - 1))) end -= 1;
  return `${reason.slice(0, end)}…`;
}

function isHighSurrogate(unit: number): boolean {
  return unit >= 0xd800 && unit <= 0xdbff;
}

/**
 * Splits an `x-death-reason` value into its code (before the first `:`) and its detail; a value
 * without `:` is all code. The inverse of `deathReason`, for any code (a handler's own too).
 */
export function splitDeathReason(reason: string): { code: string; detail: string } {
  const separator = reason.indexOf(':');
  return separator === -1
    ? { code: reason.trim(), detail: '' }
    : { code: reason.slice(0, separator).trim(), detail: reason.slice(separator + 1).trim() };
}
