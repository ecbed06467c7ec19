import { CLAIM_CHECK_HEADER, isTransportHeader, type HeaderMap } from './headers';
import { isTraceHeader } from './trace-headers';

/** Headers of Claim Check messages (part of the wire contract). */
export const ClaimCheckHeader = {
  /** `1`: the body is a signed ticket (JSON); `0` or absent: the body is the payload itself. */
  claimCheck: CLAIM_CHECK_HEADER,
  contentType: 'content-type',
} as const;

/**
 * What a message's `x-claim-check` header says of its body: a ticket, the payload itself
 * (`inline`), or neither (`unrecognised`, with the problem to report).
 */
export type ClaimCheckMarking =
  | { readonly via: 'ticket' | 'inline' }
  | { readonly via: 'unrecognised'; readonly problem: string };

/**
 * Reads `x-claim-check`. A Buffer is decoded as UTF-8 first: AMQP clients of other languages may
 * send the header as a byte array, which amqplib hands over as a Buffer (as for `x-sequence-id`).
 * A value present but neither 1/true nor 0/false is `unrecognised` rather than inline: taken for
 * an inline payload, a ticket would reach its handler as the payload's bytes.
 */
export function claimCheckMarking(headers: Readonly<Record<string, unknown>>): ClaimCheckMarking {
  const raw = headers[ClaimCheckHeader.claimCheck];
  if (raw === undefined || raw === null) return { via: 'inline' };
  const value = Buffer.isBuffer(raw)
    ? raw.toString('utf8')
    : typeof raw === 'bigint' && (raw === 0n || raw === 1n)
      ? Number(raw)
      : raw;
  if (value === 1 || value === '1' || value === true || value === 'true') return { via: 'ticket' };
  if (value === 0 || value === '0' || value === false || value === 'false') {
    return { via: 'inline' };
  }
  const shown =
    typeof value === 'string'
      ? JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value)
      : typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint'
        ? String(value)
        : Object.prototype.toString.call(value);
  return {
    via: 'unrecognised',
    problem:
      `${ClaimCheckHeader.claimCheck} is ${shown}; expected 1 or true (the body is a ticket), ` +
      '0 or false (the body is the payload), or no such header',
  };
}

/** The sender's own headers of a Claim Check message: without the transport's, ours, or trace context. */
export function userHeadersOf(headers: Readonly<Record<string, unknown>>): HeaderMap {
  const own: HeaderMap = {};
  for (const [name, value] of Object.entries(headers)) {
    if (name === ClaimCheckHeader.claimCheck || name === ClaimCheckHeader.contentType) continue;
    if (isTransportHeader(name) || isTraceHeader(name)) continue;
    if (typeof value === 'string' || typeof value === 'number' || typeof value === 'boolean') {
      own[name] = value;
    }
  }
  return own;
}
