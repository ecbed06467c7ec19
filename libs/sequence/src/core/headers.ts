import { CONTENT_TYPE_PATTERN } from './claim-ticket';
import { MalformedFragmentError } from './errors/malformed-fragment.error';
import { isTraceHeader } from './trace-headers';
import { SEQUENCE_ID_PATTERN } from './sequence-id';

/** Header names of the wire contract, version 1 (see docs/message-sequence.md). */
export const SequenceHeader = {
  id: 'x-sequence-id',
  position: 'x-sequence-position',
  size: 'x-sequence-size',
  last: 'x-sequence-last',
  crc32: 'x-fragment-crc32',
  sha256: 'x-sequence-sha256',
  bytes: 'x-sequence-bytes',
  version: 'x-sequence-version',
  contentType: 'content-type',
  contentEncoding: 'content-encoding',
  deathReason: 'x-death-reason',
} as const;

export const WIRE_VERSION = 1;

export { SEQUENCE_ID_PATTERN };

/** Header values as transports carry them. */
export type HeaderValue = string | number | boolean;
export type HeaderMap = Record<string, HeaderValue>;

/** The contract headers of one fragment, parsed and validated. */
export interface FragmentHeaders {
  readonly sequenceId: string;
  /** 1-based. */
  readonly position: number;
  /** Number of fragments; absent on the non-last fragments of a streamed sequence. */
  readonly size?: number;
  readonly last: boolean;
  readonly crc32: number;
  /** SHA-256 (lowercase hex) of the whole payload; always present on the last fragment. */
  readonly sha256?: string;
  /** Total payload bytes, when the producer knew them. */
  readonly bytes?: number;
  readonly contentType?: string;
  readonly contentEncoding?: string;
  /** Every header that is not part of the contract: the producer's own, passed to the handler. */
  readonly userHeaders: HeaderMap;
}

/**
 * Set to 1 on a fragment whose body is a Claim Check ticket (a fragment sent with
 * `via: 'claim-check'`): the receiver resolves the ticket to the body. Not a user header.
 */
export const CLAIM_CHECK_HEADER = 'x-claim-check';

const CONTRACT_HEADERS: ReadonlySet<string> = new Set([
  SequenceHeader.id,
  SequenceHeader.position,
  SequenceHeader.size,
  SequenceHeader.last,
  SequenceHeader.crc32,
  SequenceHeader.sha256,
  SequenceHeader.bytes,
  SequenceHeader.version,
]);

/**
 * True for the header names the wire contract owns (users may not set them). Names are matched
 * exactly: AMQP header names are case-sensitive, and the contract's are lowercase.
 */
export function isContractHeader(name: string): boolean {
  return CONTRACT_HEADERS.has(name);
}

/** Longest header name AMQP carries (a short string: its length in one byte). */
export const MAX_HEADER_NAME_BYTES = 255;

/**
 * What is wrong with headers a user gives to `send()` or `publish()`: names of the wire contract
 * (its own, and {@link CLAIM_CHECK_HEADER}, which tells a receiver that a body is a ticket) and
 * values that are not header values.
 */
export function userHeaderProblems(headers: Readonly<Record<string, unknown>>): string[] {
  const problems: string[] = [];
  // A string would be taken as headers '0', '1', ... (its characters).
  if (typeof headers !== 'object' || headers === null || Array.isArray(headers)) {
    return ['headers must be an object of string, number or boolean values'];
  }
  for (const [name, value] of Object.entries(headers)) {
    if (isContractHeader(name) || name === CLAIM_CHECK_HEADER) {
      problems.push(`header ${name} belongs to the wire contract; rename yours`);
    } else if (hasFragmentPrefix(name)) {
      // A receiver takes a message with any such header for a fragment of a sequence.
      problems.push(
        `header ${name} is in the wire contract's x-sequence-* / x-fragment-* space ` +
          '(any case); rename yours',
      );
    }
    // Copied from a delivery (a dead letter forwarded whole), they would mislead the receiver:
    // an old x-requeue-count, say, counts against the new message's requeue budget.
    if (isTransportHeader(name)) {
      problems.push(
        `header ${name} is set by the broker or transport on each delivery; do not send it`,
      );
    }
    if (Buffer.byteLength(name) > MAX_HEADER_NAME_BYTES) {
      problems.push(
        `header name ${name.slice(0, 40)}… is over ${MAX_HEADER_NAME_BYTES} bytes (AMQP's limit)`,
      );
    }
    if (!['string', 'number', 'boolean'].includes(typeof value)) {
      problems.push(`header ${name} must be a string, number or boolean`);
    } else if (typeof value === 'number' && !Number.isFinite(value)) {
      problems.push(`header ${name} must be a finite number, got ${value}`);
    } else if (
      (name === SequenceHeader.contentType || name === SequenceHeader.contentEncoding) &&
      value !== '' &&
      (typeof value !== 'string' || !CONTENT_TYPE_PATTERN.test(value))
    ) {
      // Receivers read it as the payload's own: one they refuse would dead-letter the message.
      problems.push(
        `header ${name} must be 1-255 printable ASCII characters, got ${JSON.stringify(value)} ` +
          '(or give contentType / contentEncoding instead)',
      );
    }
  }
  return problems;
}

/**
 * Headers brokers and transports add on their own (RabbitMQ's dead-lettering and quorum delivery
 * count, the requeue counter, a death reason): metadata of one delivery, not the producer's, so
 * they are not handed to the handler as user headers.
 */
const TRANSPORT_HEADER = /^x-(death|first-death-|last-death-|delivery-count$|requeue-count$)/;

/** True for headers a transport adds to a delivery (see {@link TRANSPORT_HEADER}). */
export function isTransportHeader(name: string): boolean {
  return TRANSPORT_HEADER.test(name);
}

/**
 * True when a message carries any header of the fragment contract (`x-sequence-*`,
 * `x-fragment-*`): it is a fragment of a Message Sequence, whole or not, and never a payload on
 * its own. One whose headers are incomplete is refused as a fragment (`malformed-header`).
 */
export function carriesFragmentHeaders(headers: Readonly<Record<string, unknown>>): boolean {
  return Object.keys(headers).some(hasFragmentPrefix);
}

/** True for a name in the fragment contract's space: `x-sequence-*` or `x-fragment-*`, any case. */
function hasFragmentPrefix(name: string): boolean {
  const lower = name.toLowerCase();
  return lower.startsWith('x-sequence-') || lower.startsWith('x-fragment-');
}

/**
 * Parses and validates a fragment's headers against the wire contract. Numbers may arrive as
 * JSON numbers or as canonical decimal strings (producers in other languages, AMQP field tables);
 * booleans as booleans or `"true"`/`"false"`. Throws {@link MalformedFragmentError} naming the
 * header at fault.
 */
export function parseFragmentHeaders(headers: Readonly<Record<string, unknown>>): FragmentHeaders {
  // amqplib gives `properties.headers` as undefined for a message published without any.
  if (typeof headers !== 'object' || headers === null) {
    throw new MalformedFragmentError('malformed-header', SequenceHeader.id, 'missing');
  }
  const rawId = headers[SequenceHeader.id];
  const sequenceId = headerText(rawId);
  if (sequenceId === undefined) {
    throw new MalformedFragmentError('malformed-header', SequenceHeader.id, 'missing');
  }
  if (!SEQUENCE_ID_PATTERN.test(sequenceId)) {
    throw new MalformedFragmentError(
      'malformed-header',
      SequenceHeader.id,
      'must be 1-128 characters of [A-Za-z0-9._:-]',
    );
  }
  const fail = (header: string, detail: string): never => {
    throw new MalformedFragmentError('malformed-header', header, detail, sequenceId);
  };

  const version = readInteger(headers[SequenceHeader.version]);
  if (version === undefined) {
    if (headers[SequenceHeader.version] === undefined) fail(SequenceHeader.version, 'missing');
    fail(SequenceHeader.version, 'must be an integer');
  }
  if (version !== WIRE_VERSION) {
    throw new MalformedFragmentError(
      'unsupported-version',
      SequenceHeader.version,
      `version ${version} is not supported (this consumer speaks ${WIRE_VERSION})`,
      sequenceId,
    );
  }

  const position = requireInteger(headers, SequenceHeader.position, 1, fail);
  const size = optionalInteger(headers, SequenceHeader.size, 1, fail);
  const bytes = optionalInteger(headers, SequenceHeader.bytes, 0, fail);
  const crc32 = requireInteger(headers, SequenceHeader.crc32, 0, fail);
  if (crc32 > 0xffffffff) fail(SequenceHeader.crc32, 'must be an unsigned 32-bit integer');

  const rawLast = headers[SequenceHeader.last];
  const last = rawLast === undefined ? false : readBoolean(rawLast);
  if (last === undefined) fail(SequenceHeader.last, 'must be a boolean');

  const rawSha = headers[SequenceHeader.sha256];
  const sha256 = rawSha === undefined ? undefined : headerText(rawSha)?.toLowerCase();
  if (rawSha !== undefined && (sha256 === undefined || !/^[0-9a-f]{64}$/.test(sha256))) {
    fail(SequenceHeader.sha256, 'must be 64 hexadecimal characters');
  }

  if (size !== undefined && position > size) {
    fail(SequenceHeader.position, `position ${position} is beyond size ${size}`);
  }
  if (size !== undefined && position === size && !last) {
    fail(SequenceHeader.last, `the fragment at position ${position} = size must carry it (true)`);
  }
  if (last) {
    if (size === undefined) fail(SequenceHeader.size, 'the last fragment must carry the size');
    if (position !== size) {
      fail(SequenceHeader.last, `the last fragment is at position ${position}, size is ${size}`);
    }
    if (sha256 === undefined) fail(SequenceHeader.sha256, 'the last fragment must carry it');
  }

  const userHeaders: HeaderMap = {};
  for (const [name, value] of Object.entries(headers)) {
    if (isContractHeader(name) || isTransportHeader(name) || isTraceHeader(name)) continue;
    if (value === undefined || value === null) continue;
    if (name === SequenceHeader.contentType || name === SequenceHeader.contentEncoding) continue;
    if (name === CLAIM_CHECK_HEADER) continue;
    const normalized = toHeaderValue(value);
    if (normalized !== undefined) userHeaders[name] = normalized;
  }

  return {
    sequenceId,
    position,
    size,
    last: last === true,
    crc32,
    sha256,
    bytes,
    contentType: contentDescription(headers, SequenceHeader.contentType, fail),
    contentEncoding: contentDescription(headers, SequenceHeader.contentEncoding, fail),
    userHeaders,
  };
}

/**
 * `content-type` or `content-encoding`: 1-255 printable ASCII characters, as the library's
 * producers send them (a sequence keeps them until it ends, outside `maxHeaderBytes`); empty is
 * absent.
 */
function contentDescription(
  headers: Readonly<Record<string, unknown>>,
  name: string,
  fail: (header: string, detail: string) => never,
): string | undefined {
  const raw = headers[name];
  if (raw === undefined || raw === null) return undefined;
  const text = headerText(raw);
  if (text === '') return undefined;
  if (text === undefined || !CONTENT_TYPE_PATTERN.test(text)) {
    fail(name, 'must be 1-255 printable ASCII characters');
  }
  return text;
}

/** What the splitter knows about one fragment when it builds its headers. */
export type FragmentHeaderInput = Omit<FragmentHeaders, 'userHeaders'> & {
  readonly userHeaders?: HeaderMap;
};

/**
 * Builds the headers of one fragment: the user's headers, minus any contract name (so a stray
 * `x-sequence-last` can never survive on a non-last fragment), then the contract's.
 */
export function buildFragmentHeaders(input: FragmentHeaderInput): HeaderMap {
  const headers: HeaderMap = {};
  for (const [name, value] of Object.entries(input.userHeaders ?? {})) {
    if (!isContractHeader(name)) headers[name] = value;
  }
  headers[SequenceHeader.version] = WIRE_VERSION;
  headers[SequenceHeader.id] = input.sequenceId;
  headers[SequenceHeader.position] = input.position;
  if (input.size !== undefined) headers[SequenceHeader.size] = input.size;
  if (input.last) headers[SequenceHeader.last] = true;
  headers[SequenceHeader.crc32] = input.crc32;
  if (input.sha256 !== undefined) headers[SequenceHeader.sha256] = input.sha256;
  if (input.bytes !== undefined) headers[SequenceHeader.bytes] = input.bytes;
  if (input.contentType !== undefined) headers[SequenceHeader.contentType] = input.contentType;
  if (input.contentEncoding !== undefined) {
    headers[SequenceHeader.contentEncoding] = input.contentEncoding;
  }
  return headers;
}

function requireInteger(
  headers: Readonly<Record<string, unknown>>,
  name: string,
  min: number,
  fail: (header: string, detail: string) => never,
): number {
  const raw = headers[name];
  if (raw === undefined || raw === null) return fail(name, 'missing');
  return checkInteger(raw, name, min, fail);
}

function optionalInteger(
  headers: Readonly<Record<string, unknown>>,
  name: string,
  min: number,
  fail: (header: string, detail: string) => never,
): number | undefined {
  const raw = headers[name];
  if (raw === undefined || raw === null) return undefined;
  return checkInteger(raw, name, min, fail);
}

function checkInteger(
  raw: unknown,
  name: string,
  min: number,
  fail: (header: string, detail: string) => never,
): number {
  const value = readInteger(raw);
  if (value === undefined) return fail(name, `must be an integer, got ${describe(raw)}`);
  if (value < min) return fail(name, `must be >= ${min}, got ${value}`);
  return value;
}

/**
 * An integer header's value as the wire contract allows it: a safe integer from a number, a
 * bigint or a canonical decimal string (a Buffer read as UTF-8); undefined for anything else.
 */
export function readInteger(raw: unknown): number | undefined {
  // `+ 0` turns a -0 (JSON.parse('-0')) into 0: the integer the header means.
  if (typeof raw === 'number') return Number.isSafeInteger(raw) ? raw + 0 : undefined;
  if (typeof raw === 'bigint') {
    return raw <= BigInt(Number.MAX_SAFE_INTEGER) && raw >= BigInt(Number.MIN_SAFE_INTEGER)
      ? Number(raw)
      : undefined;
  }
  const text = headerText(raw);
  if (text === undefined || !/^(0|-?[1-9][0-9]{0,15})$/.test(text)) return undefined;
  const value = Number(text);
  return Number.isSafeInteger(value) ? value : undefined;
}

/**
 * Whether fragment headers say `x-sequence-last: true`, reading that header only (the headers of
 * a fragment already taken: {@link parseFragmentHeaders} checked them all).
 */
export function isLastFragment(headers: Readonly<Record<string, unknown>>): boolean {
  return readBoolean(headers[SequenceHeader.last]) === true;
}

function readBoolean(raw: unknown): boolean | undefined {
  if (typeof raw === 'boolean') return raw;
  const text = headerText(raw);
  if (text === 'true') return true;
  if (text === 'false') return false;
  return undefined;
}

/**
 * A header's text: a string as it is, a Buffer as UTF-8 (AMQP clients of other languages may
 * send a header as a byte array, a Java `byte[]`, which amqplib hands over as a Buffer), else
 * undefined.
 */
export function headerText(raw: unknown): string | undefined {
  if (typeof raw === 'string') return raw;
  if (Buffer.isBuffer(raw)) return raw.toString('utf8');
  return undefined;
}

/** A header value as the wire contract carries it; `undefined` for anything else (tables, arrays). */
export function toHeaderValue(raw: unknown): HeaderValue | undefined {
  if (typeof raw === 'string' || typeof raw === 'number' || typeof raw === 'boolean') return raw;
  if (typeof raw === 'bigint') return raw.toString();
  if (Buffer.isBuffer(raw)) return raw.toString('utf8');
  return undefined;
}

function describe(raw: unknown): string {
  const text = headerText(raw);
  if (text !== undefined) {
    return JSON.stringify(text.length > 40 ? `${text.slice(0, 40)}…` : text);
  }
  if (typeof raw === 'number' || typeof raw === 'boolean' || typeof raw === 'bigint') {
    return String(raw);
  }
  return Object.prototype.toString.call(raw);
}
