import { timingSafeEqual } from 'node:crypto';
import { ClaimTicketAudienceError } from './errors/claim-ticket-audience.error';
import { ClaimTicketInvalidError } from './errors/claim-ticket-invalid.error';
import { type ClaimTicketKeyring, TICKET_KEY_ID_PATTERN } from './claim-ticket-keyring';
import { SEQUENCE_ID_PATTERN } from './sequence-id';
import { strictUtf8 } from './unicode';

/**
 * The claim ticket: what travels on the broker in place of a parked payload. DESIGN.md names the
 * fields `{ store, ref, bytes, sha256, contentType, expiresAt, sig }`; three are added:
 *
 * - `v`, the format version, so that a later format can be told apart instead of half-parsed.
 * - `kid`, the id of the key that signed it. Keys rotate (the first configured key signs, all of
 *   them verify), so a receiver holds several; `kid` lets it pick the one key to check against
 *   instead of trying each. A `kid` the receiver does not hold is refused as `unknown-key`
 *   without trying the other keys: `kid` is itself signed, so a ticket whose `kid` names no key
 *   cannot have been written by any honest holder of one, and the distinct reason tells an
 *   operator exactly what went wrong (a key retired before its tickets expired, or a key never
 *   shared with this side) where "bad signature" would send them looking for tampering. It also
 *   bounds the work an attacker can cause per message to one HMAC.
 * - `audience` (from `v: 2`), the channels whose consumers may claim it, signed with the rest: a
 *   ticket taken off one channel and published on another is refused (`wrong-audience`) before
 *   its payload is touched. Version 1 tickets have no audience; a receiver takes them only while
 *   it allows tickets without one (see {@link checkTicketAudience}).
 * - `sequenceId` and `position` (`v: 3`), on the ticket of a Message Sequence fragment only: the
 *   fragment it carries, signed with the rest, so that a copy under another fragment's headers is
 *   refused (see {@link ticketFragmentProblem}). Version 2 fragment tickets name no fragment.
 *
 * A ticket holds no credentials: `ref` names a payload inside a store this side is configured
 * with, nothing more.
 */
export interface ClaimTicket {
  /**
   * `3` for a fragment's ticket (it has `sequenceId` and `position`), `2` for any other written
   * now; `1` for tickets of earlier releases, which have no `audience`.
   */
  readonly v: 1 | 2 | 3;
  /**
   * Name of the payload store holding the payload: 1-64 characters of `[A-Za-z0-9._-]`, the
   * first a letter or digit.
   */
  readonly store: string;
  /** The store's ref for the payload: opaque, 1–512 characters, untrusted until signed. */
  readonly ref: string;
  /** Payload size in bytes, as the sender wrote it (before any encryption at rest). */
  readonly bytes: number;
  /** SHA-256 of the payload, 64 lowercase hex digits. */
  readonly sha256: string;
  readonly contentType?: string;
  /** After this instant (epoch ms) the ticket is refused and the payload may be swept. */
  readonly expiresAt: number;
  /**
   * The channels on which a consumer may claim the ticket (distinct, each 1-255 characters); empty
   * for a ticket meant for `checkOut` by hand only. Present on every `v: 2` ticket, absent on
   * `v: 1` ones.
   */
  readonly audience?: readonly string[];
  /**
   * The sequence whose fragment the ticket carries (`x-sequence-id`): present on every `v: 3`
   * ticket, with `position`, and on no other.
   */
  readonly sequenceId?: string;
  /** That fragment's 1-based position (`x-sequence-position`): with `sequenceId`. */
  readonly position?: number;
  /** Id of the key whose secret made `sig`. */
  readonly kid: string;
  /** HMAC-SHA256 over the other fields, base64url without padding (43 characters). */
  readonly sig: string;
}

/** What the sender decides; `v`, `kid` and `sig` are added by {@link signTicket}. */
export type ClaimTicketFields = Omit<ClaimTicket, 'v' | 'kid' | 'sig' | 'audience'> & {
  readonly audience: readonly string[];
};

/** The version {@link signTicket} writes, but for a fragment's ticket. */
export const CLAIM_TICKET_VERSION = 2;
/** The version {@link signTicket} writes for a fragment's ticket: it names the fragment. */
export const FRAGMENT_TICKET_VERSION = 3;
/** Tickets of earlier releases: no `audience`. */
const LEGACY_TICKET_VERSION = 1;
/** Latest `expiresAt` a ticket may have: the last instant a `Date` holds. */
export const MAX_EXPIRES_AT = 8.64e15;

/** Longest channel name a ticket's audience holds. */
export const MAX_AUDIENCE_CHANNEL_LENGTH = 255;

/**
 * What the audience of a fragment's ticket (a Message Sequence fragment sent `via:
 * 'claim-check'`) names before its channel. Such a ticket is taken only as a fragment of that
 * channel, and a ticket naming the channel itself only as a whole payload: neither passes for the
 * other when replayed. No channel name starts so on NATS, whose subjects hold no spaces.
 */
export const FRAGMENT_AUDIENCE_PREFIX = 'fragment of ';

/** The audience entry of the tickets of fragments sent on `channel`. */
export function fragmentAudience(channel: string): string {
  return FRAGMENT_AUDIENCE_PREFIX + channel;
}

/**
 * The problem with claim-checking whole payloads on `channel`, or undefined: a name that starts
 * with {@link FRAGMENT_AUDIENCE_PREFIX} is the audience of another channel's fragment tickets, so
 * its consumers would take those fragments' tickets as whole payloads, and its tickets would pass
 * for that channel's fragments.
 */
export function reservedAudienceProblem(channel: string, name = 'channel'): string | undefined {
  if (!channel.startsWith(FRAGMENT_AUDIENCE_PREFIX)) return undefined;
  return (
    `${name} "${channel}" starts with "${FRAGMENT_AUDIENCE_PREFIX}", which claim tickets keep ` +
    `for the fragments of channel "${channel.slice(FRAGMENT_AUDIENCE_PREFIX.length)}"; ` +
    'name the channel otherwise'
  );
}

/** The channel an audience entry names: a fragment's channel, or the entry itself. */
export function audienceChannel(entry: string): string {
  return entry.startsWith(FRAGMENT_AUDIENCE_PREFIX)
    ? entry.slice(FRAGMENT_AUDIENCE_PREFIX.length)
    : entry;
}
/** Ticket bodies larger than this are refused before they are parsed. */
export const MAX_TICKET_BODY_BYTES = 8 * 1024;
/** A payload store's name as tickets carry it: `filesystem`, `redis`, `s3`, `archive-eu.1`. */
export const STORE_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
export const MAX_TICKET_REF_LENGTH = 512;

const SHA256_HEX = /^[0-9a-f]{64}$/;
/** base64url of the 32 bytes of an HMAC-SHA256, without padding. */
const SIGNATURE = /^[A-Za-z0-9_-]{43}$/;
/** Printable ASCII, not starting with a space: what a media type header value looks like. */
export const CONTENT_TYPE_PATTERN = /^[\x21-\x7e][\x20-\x7e]{0,254}$/;
const TICKET_FIELDS: ReadonlySet<string> = new Set([
  'v',
  'store',
  'ref',
  'bytes',
  'sha256',
  'contentType',
  'expiresAt',
  'audience',
  'sequenceId',
  'position',
  'kid',
  'sig',
]);
/** Separates ticket signatures from any other HMAC made with the same secret. */
const SIGNING_DOMAIN = 'nest-sequence/claim-ticket';

/**
 * The exact string a ticket's `sig` is the HMAC-SHA256 of: a JSON array of a domain tag and the
 * fields in a fixed order, `contentType` as `null` when absent, then (from `v: 2`) the audience as
 * an array of strings. An array leaves no room for ambiguity (field order, duplicate keys,
 * separators inside values), and producers in other languages can rebuild it byte for byte:
 * every value is a string, `null`, a safe integer or an array of strings. From `v: 3`, the
 * sequence id and position follow. `v` leads, so a ticket stripped of its audience or fragment
 * and relabelled an earlier version no longer matches its `sig`.
 */
export function ticketSigningInput(ticket: Omit<ClaimTicket, 'sig'>): string {
  const signed: unknown[] = [
    SIGNING_DOMAIN,
    ticket.v,
    ticket.kid,
    ticket.store,
    ticket.ref,
    ticket.bytes,
    ticket.sha256,
    ticket.contentType ?? null,
    ticket.expiresAt,
  ];
  if (ticket.v !== LEGACY_TICKET_VERSION) signed.push(ticket.audience ?? []);
  if (ticket.v === FRAGMENT_TICKET_VERSION) signed.push(ticket.sequenceId, ticket.position);
  return JSON.stringify(signed);
}

/**
 * Signs a ticket with the keyring's first key, for the channels of `fields.audience`; with
 * `sequenceId` and `position`, for that fragment only (`v: 3`).
 * @throws ClaimTicketInvalidError (`malformed`) when a field breaks the ticket format, or the
 * ticket would not fit in `MAX_TICKET_BODY_BYTES`, so that a sender never publishes a ticket its
 * receivers would refuse.
 */
export function signTicket(fields: ClaimTicketFields, keys: ClaimTicketKeyring): ClaimTicket {
  const bound = fields.sequenceId !== undefined || fields.position !== undefined;
  const problem =
    fieldProblem(fields) ??
    ticketAudienceProblem(fields.audience) ??
    (bound ? fragmentFieldProblem(fields) : undefined);
  if (problem !== undefined) throw new ClaimTicketInvalidError('malformed', problem);
  const unsigned: Omit<ClaimTicket, 'sig'> = {
    v: bound ? FRAGMENT_TICKET_VERSION : CLAIM_TICKET_VERSION,
    store: fields.store,
    ref: fields.ref,
    bytes: fields.bytes,
    sha256: fields.sha256,
    ...(fields.contentType == null ? {} : { contentType: fields.contentType }),
    expiresAt: fields.expiresAt,
    audience: Object.freeze([...fields.audience]),
    ...(bound ? { sequenceId: fields.sequenceId, position: fields.position } : {}),
    kid: keys.signingKeyId,
  };
  const ticket = Object.freeze({ ...unsigned, sig: hmac(keys, unsigned).toString('base64url') });
  const size = serializeTicket(ticket).byteLength;
  if (size > MAX_TICKET_BODY_BYTES) {
    throw new ClaimTicketInvalidError(
      'malformed',
      `the ticket would be ${size} bytes, over the ${MAX_TICKET_BODY_BYTES}-byte limit for ` +
        'tickets; name fewer or shorter channels in its audience',
    );
  }
  return ticket;
}

/**
 * Checks that `candidate` (an untrusted value, e.g. from {@link parseTicketBody}) is a ticket of
 * this format, signed by one of `keys`, and not expired at `now` (epoch ms). Checks run in this
 * order: a signature is present, the shape, the key is known, the signature matches, expiry.
 * Nothing about a ticket is trusted, its expiry included, before its signature matched.
 * @returns a frozen copy holding the ticket fields only.
 * @throws ClaimTicketInvalidError naming the first check that failed.
 */
export function verifyTicket(
  candidate: unknown,
  keys: ClaimTicketKeyring,
  now: number,
): ClaimTicket {
  // A NaN `now` would make every ticket look unexpired.
  if (!Number.isFinite(now)) throw new RangeError(`now must be a finite epoch ms, got ${now}`);
  const ticket = verifyTicketSignature(candidate, keys);
  if (ticket.expiresAt <= now) {
    throw new ClaimTicketInvalidError(
      'expired',
      `expired at ${new Date(ticket.expiresAt).toISOString()}, ${now - ticket.expiresAt} ms ago`,
      ticket.kid,
    );
  }
  return ticket;
}

/**
 * {@link verifyTicket} but for the expiry: for a ticket already refused `expired`, whose signed
 * fields may still tell a duplicate of one that was handled.
 * @throws ClaimTicketInvalidError naming the first check that failed (never `expired`).
 */
export function verifyTicketSignature(candidate: unknown, keys: ClaimTicketKeyring): ClaimTicket {
  if (typeof candidate !== 'object' || candidate === null || Array.isArray(candidate)) {
    throw new ClaimTicketInvalidError('malformed', 'a ticket is a JSON object');
  }
  const fields = candidate as Record<string, unknown>;
  // Before the shape: a peer that does not sign sends none of v, kid or sig, and "unsigned"
  // tells its operator more than "v is missing" would.
  if (fields.sig === undefined || fields.sig === null || fields.sig === '') {
    throw new ClaimTicketInvalidError('unsigned', 'the ticket has no sig');
  }
  const unknownField = Object.keys(fields).find((name) => !TICKET_FIELDS.has(name));
  if (unknownField !== undefined) {
    // Unsigned extra fields would ride along unverified; a later format bumps `v` instead.
    throw new ClaimTicketInvalidError('malformed', `unknown field ${JSON.stringify(unknownField)}`);
  }
  const version = fields.v;
  if (
    version !== CLAIM_TICKET_VERSION &&
    version !== FRAGMENT_TICKET_VERSION &&
    version !== LEGACY_TICKET_VERSION
  ) {
    throw new ClaimTicketInvalidError(
      'malformed',
      `v must be ${CLAIM_TICKET_VERSION} or ${FRAGMENT_TICKET_VERSION} (or ` +
        `${LEGACY_TICKET_VERSION}), got ${JSON.stringify(version) ?? 'nothing'}`,
    );
  }
  const problem =
    fieldProblem(fields) ??
    (version === LEGACY_TICKET_VERSION
      ? fields.audience === undefined
        ? undefined
        : `audience is not a field of v ${LEGACY_TICKET_VERSION} tickets`
      : ticketAudienceProblem(fields.audience)) ??
    (version === FRAGMENT_TICKET_VERSION
      ? fragmentFieldProblem(fields)
      : fields.sequenceId !== undefined || fields.position !== undefined
        ? `sequenceId and position are fields of v ${FRAGMENT_TICKET_VERSION} tickets only`
        : undefined);
  if (problem !== undefined) throw new ClaimTicketInvalidError('malformed', problem);
  const { kid, sig } = fields;
  if (typeof kid !== 'string' || !TICKET_KEY_ID_PATTERN.test(kid)) {
    throw new ClaimTicketInvalidError(
      'malformed',
      'kid must be 1-64 characters of [A-Za-z0-9._:-]',
    );
  }
  if (typeof sig !== 'string') {
    throw new ClaimTicketInvalidError('malformed', 'sig must be a string', kid);
  }
  const ticket: ClaimTicket = Object.freeze({
    v: version,
    store: fields.store as string,
    ref: fields.ref as string,
    bytes: fields.bytes as number,
    sha256: fields.sha256 as string,
    // `null` (how the signing input writes an absent one, and another language's encoder may
    // write it in the body) is absent.
    ...(fields.contentType == null ? {} : { contentType: fields.contentType as string }),
    expiresAt: fields.expiresAt as number,
    ...(version === LEGACY_TICKET_VERSION
      ? {}
      : { audience: Object.freeze([...(fields.audience as string[])]) }),
    ...(version === FRAGMENT_TICKET_VERSION
      ? { sequenceId: fields.sequenceId as string, position: fields.position as number }
      : {}),
    kid,
    sig,
  });

  if (!keys.has(kid)) {
    throw new ClaimTicketInvalidError('unknown-key', 'no configured key has this id', kid);
  }
  // A sig of another shape cannot be an HMAC-SHA256 (and Buffer.from(…, 'base64url') would
  // silently skip stray characters); refusing it also gives timingSafeEqual equal lengths.
  // Canonical spelling only: the last base64url character has two unused bits, so several
  // spellings decode to one HMAC; accepting only the one we write keeps tickets unmalleable.
  const decoded = SIGNATURE.test(sig) ? Buffer.from(sig, 'base64url') : undefined;
  const given = decoded?.toString('base64url') === sig ? decoded : undefined;
  if (given === undefined || !timingSafeEqual(given, hmac(keys, ticket))) {
    throw new ClaimTicketInvalidError('bad-signature', 'sig does not match the fields', kid);
  }
  return ticket;
}

/**
 * Checks that a verified ticket may be claimed on `channel`: the channel is in its audience. A
 * ticket without an audience (`v: 1`, from a release before tickets named their channels) is
 * taken only with `acceptWithoutAudience`, for the time old producers' tickets drain.
 * @throws ClaimTicketAudienceError when the channel is not in the audience;
 * ClaimTicketInvalidError (`no-audience`) for a ticket without one, unless accepted.
 */
export function checkTicketAudience(
  ticket: ClaimTicket,
  channel: string,
  acceptWithoutAudience: boolean,
): void {
  const { audience } = ticket;
  if (audience === undefined) {
    if (acceptWithoutAudience) return;
    throw new ClaimTicketInvalidError(
      'no-audience',
      `the ticket (v ${ticket.v}) names no channel, and ${JSON.stringify(channel)} takes only ` +
        'tickets issued for it',
      ticket.kid,
    );
  }
  if (!audience.includes(channel)) {
    throw new ClaimTicketAudienceError(
      `${ticket.store}:${ticket.ref}`,
      channel,
      audience,
      ticket.kid,
    );
  }
}

/** The Message Sequence fragment a `v: 3` ticket carries. */
export interface TicketFragment {
  /** `x-sequence-id`: 1-128 characters of `[A-Za-z0-9._:-]`. */
  readonly sequenceId: string;
  /** `x-sequence-position`: 1-based. */
  readonly position: number;
}

/**
 * Why a verified ticket may not carry `fragment` (the fragment whose headers came with it), or
 * `undefined` when it may: a `v: 3` ticket carries only the fragment it names. Tickets of other
 * versions name none (fragments parked before tickets named them) and are not refused here.
 * A consumer dead-letters a refused one `wrong-audience`, before its payload is read.
 */
export function ticketFragmentProblem(
  ticket: ClaimTicket,
  fragment: TicketFragment,
): string | undefined {
  if (ticket.v !== FRAGMENT_TICKET_VERSION) return undefined;
  if (ticket.sequenceId === fragment.sequenceId && ticket.position === fragment.position) {
    return undefined;
  }
  return (
    `the ticket was issued for sequence ${ticket.sequenceId} fragment ${ticket.position}, not ` +
    `for sequence ${fragment.sequenceId} fragment ${fragment.position}`
  );
}

/**
 * Parses a message body as a ticket candidate for {@link verifyTicket}: strict UTF-8 JSON of at
 * most 8 KiB (`MAX_TICKET_BODY_BYTES`), refused by size before any parsing.
 * @throws ClaimTicketInvalidError (`malformed`).
 */
export function parseTicketBody(body: Uint8Array): unknown {
  if (body.byteLength > MAX_TICKET_BODY_BYTES) {
    throw new ClaimTicketInvalidError(
      'malformed',
      `the body is ${body.byteLength} bytes, over the ${MAX_TICKET_BODY_BYTES}-byte limit for tickets`,
    );
  }
  const text = strictUtf8(body);
  if (text === undefined) {
    throw new ClaimTicketInvalidError('malformed', 'the body is not valid UTF-8');
  }
  try {
    return JSON.parse(text);
  } catch {
    throw new ClaimTicketInvalidError('malformed', 'the body is not valid JSON');
  }
}

/** A ticket as a message body (UTF-8 JSON), for {@link parseTicketBody} on the other side. */
export function serializeTicket(ticket: ClaimTicket): Buffer {
  return Buffer.from(JSON.stringify(ticket), 'utf8');
}

/** The first field that breaks the format, described; `undefined` when all are well. */
function fieldProblem(fields: Record<string, unknown>): string | undefined {
  const { store, ref, bytes, sha256, contentType, expiresAt } = fields;
  if (typeof store !== 'string' || !STORE_NAME_PATTERN.test(store)) {
    return 'store must be 1-64 characters of [A-Za-z0-9._-], starting with a letter or digit';
  }
  if (typeof ref !== 'string' || ref.length < 1 || ref.length > MAX_TICKET_REF_LENGTH) {
    return `ref must be a string of 1-${MAX_TICKET_REF_LENGTH} characters`;
  }
  if (typeof bytes !== 'number' || !Number.isSafeInteger(bytes) || bytes < 0) {
    return 'bytes must be a non-negative safe integer';
  }
  if (typeof sha256 !== 'string' || !SHA256_HEX.test(sha256)) {
    return 'sha256 must be 64 lowercase hex digits';
  }
  if (
    contentType != null &&
    (typeof contentType !== 'string' || !CONTENT_TYPE_PATTERN.test(contentType))
  ) {
    return 'contentType, when present, must be 1-255 printable ASCII characters';
  }
  // An integer, not merely finite: fractions and exponents are where JSON number formatting
  // differs between languages, and the signing input must be rebuilt byte for byte.
  // At most the last instant a Date holds: a later one, "never", would overflow the times kept
  // after it (a completion's retention past the expiry, a store's TTL).
  if (
    typeof expiresAt !== 'number' ||
    !Number.isSafeInteger(expiresAt) ||
    expiresAt < 0 ||
    expiresAt > MAX_EXPIRES_AT
  ) {
    return `expiresAt must be an integer of epoch ms from 0 to ${MAX_EXPIRES_AT} (+275760-09-13)`;
  }
  return undefined;
}

/** What is wrong with a fragment's ticket's `sequenceId` or `position`, if anything. */
function fragmentFieldProblem(fields: Record<string, unknown>): string | undefined {
  const { sequenceId, position } = fields;
  if (typeof sequenceId !== 'string' || !SEQUENCE_ID_PATTERN.test(sequenceId)) {
    return 'sequenceId must be 1-128 characters of [A-Za-z0-9._:-]';
  }
  if (typeof position !== 'number' || !Number.isSafeInteger(position) || position < 1) {
    return 'position must be a positive safe integer';
  }
  return undefined;
}

/**
 * What is wrong with a ticket's audience (a list of distinct channel names of 1-255 characters,
 * possibly empty); `undefined` when it is well-formed.
 */
export function ticketAudienceProblem(audience: unknown): string | undefined {
  if (!Array.isArray(audience)) return 'audience must be an array of channel names';
  const seen = new Set<string>();
  for (const channel of audience as unknown[]) {
    // A fragment's entry (`fragment of <channel>`) is held to its channel's length.
    const length = typeof channel === 'string' ? audienceChannel(channel).length : 0;
    if (typeof channel !== 'string' || length < 1 || length > MAX_AUDIENCE_CHANNEL_LENGTH) {
      return `audience must hold channel names of 1-${MAX_AUDIENCE_CHANNEL_LENGTH} characters`;
    }
    if (seen.has(channel)) return `audience names ${JSON.stringify(channel)} twice`;
    seen.add(channel);
  }
  return undefined;
}

/**
 * The size of the smallest ticket for `audience` (one-character store, ref and key id, no
 * content type): over {@link MAX_TICKET_BODY_BYTES}, no ticket for it can be signed, whatever
 * the payload, so a sender can refuse it before storing anything.
 */
export function smallestTicketBytes(audience: readonly string[]): number {
  const smallest: ClaimTicket = {
    v: CLAIM_TICKET_VERSION,
    store: 's',
    ref: 'r',
    bytes: 0,
    sha256: '0'.repeat(64),
    expiresAt: Date.now(),
    audience,
    kid: 'k',
    sig: '0'.repeat(43), // an HMAC-SHA256 in base64url
  };
  return serializeTicket(smallest).byteLength;
}

function hmac(keys: ClaimTicketKeyring, ticket: Omit<ClaimTicket, 'sig'>): Buffer {
  const mac = keys.hmac(ticket.kid, ticketSigningInput(ticket));
  if (mac === undefined)
    throw new ClaimTicketInvalidError('unknown-key', 'no such key', ticket.kid);
  return mac;
}
