import { CLAIM_CHECK_HEADER, isTransportHeader, type HeaderMap } from '../core/headers';

/** Headers of Claim Check messages (part of the wire contract). */
export const ClaimCheckHeader = {
  /** `1`: the body is a signed ticket (JSON); `0` or absent: the body is the payload itself. */
  claimCheck: CLAIM_CHECK_HEADER,
  contentType: 'content-type',
} as const;

/** Whether a message's headers say its body is a ticket. */
export function carriesTicket(headers: Readonly<Record<string, unknown>>): boolean {
  const value = headers[ClaimCheckHeader.claimCheck];
  return value === 1 || value === '1' || value === true || value === 'true';
}

/** The sender's own headers of a Claim Check message: without the transport's and ours. */
export function userHeadersOf(headers: Readonly<Record<string, unknown>>): HeaderMap {
  const own: HeaderMap = {};
  for (const [name, value] of Object.entries(headers)) {
    if (name === ClaimCheckHeader.claimCheck || name === ClaimCheckHeader.contentType) continue;
    if (isTransportHeader(name)) continue;
    if (typeof value === 'string' || typeof value === 'number' || typeof value === 'boolean') {
      own[name] = value;
    }
  }
  return own;
}
