import { errorMessage } from '../../../core/errors/caught';
import { droppedHeadersList, leaveOutLargest } from '../../../ports/transport-headers';

/**
 * Header values on NATS are strings, and the client trims them: this codec keeps the port's
 * promise that values travel with their type and value. Each message carries one more header,
 * {@link HEADER_TYPES_HEADER}, with one letter per header, in order: `s` a string sent as it is,
 * `n` a number, `b` a boolean, `j` a value sent as JSON (a string with a line break or
 * surrounding whitespace, an array or a table). A message without it (published by another
 * program) has string values only.
 */

/** Header listing the type of every other header of the message, one letter each. */
export const HEADER_TYPES_HEADER = 'Nseq-Header-Types';
/** The deduplication id JetStream reads on publish. */
export const MSG_ID_HEADER = 'Nats-Msg-Id';

/**
 * Bytes of a message's NATS header block beyond what the port's `headerBytes` counts for the
 * caller's headers: the version line, the end of the block, `Nats-Msg-Id` and the types header
 * (whose one letter per header fits in what `headerBytes` counts per header).
 */
export const HEADER_OVERHEAD_BYTES = 256;

type TypeCode = 's' | 'n' | 'b' | 'j';

/** A header as it goes on the wire, or why it cannot. */
export type EncodedHeaders =
  | { readonly pairs: ReadonlyArray<readonly [string, string]>; readonly problem?: undefined }
  | { readonly name: string; readonly problem: string };

/** Why `name` cannot be a header of ours on NATS, or undefined when it can. */
export function headerNameProblem(name: string): string | undefined {
  if (name.length === 0) return 'has an empty name';
  for (let i = 0; i < name.length; i++) {
    const code = name.charCodeAt(i);
    if (code === 58 || code < 33 || code > 126) {
      return 'has a name with a character NATS does not carry (only printable ASCII, no ":")';
    }
  }
  if (isReservedHeader(name)) {
    return `is reserved: NATS-* headers steer the server, and ${HEADER_TYPES_HEADER} is the transport's`;
  }
  return undefined;
}

/** Headers the server or this transport set: never handed to a handler nor forwarded. */
export function isReservedHeader(name: string): boolean {
  const lower = name.toLowerCase();
  return lower.startsWith('nats-') || lower === HEADER_TYPES_HEADER.toLowerCase();
}

/** `headers` as NATS header pairs, the types header last. */
export function encodeHeaders(headers: Readonly<Record<string, unknown>>): EncodedHeaders {
  const pairs: Array<readonly [string, string]> = [];
  let types = '';
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    const nameProblem = headerNameProblem(name);
    if (nameProblem) return { name, problem: nameProblem };
    const [code, text] = encodeValue(value);
    if (text === undefined)
      return { name, problem: `is a ${typeof value}, which NATS does not carry` };
    pairs.push([name, text]);
    types += code;
  }
  if (pairs.length > 0) pairs.push([HEADER_TYPES_HEADER, types]);
  return { pairs };
}

function encodeValue(value: unknown): [TypeCode, string | undefined] {
  switch (typeof value) {
    case 'string':
      return /[\r\n]|^\s|\s$/.test(value) ? ['j', JSON.stringify(value)] : ['s', value];
    case 'number':
      return ['n', String(value)];
    case 'boolean':
      return ['b', String(value)];
    case 'object':
      return ['j', JSON.stringify(value)];
    default:
      return ['s', undefined];
  }
}

/**
 * Headers of a received message: typed by its types header when it has one that matches, strings
 * otherwise (the first value of a repeated header). Reserved headers are left out.
 */
export function decodeHeaders(
  pairs: Iterable<readonly [string, readonly string[]]>,
): Record<string, unknown> {
  const own: Array<readonly [string, string]> = [];
  let types: string | undefined;
  for (const [name, values] of pairs) {
    if (name === HEADER_TYPES_HEADER) {
      types = values[0];
      continue;
    }
    if (isReservedHeader(name)) continue;
    for (const value of values) own.push([name, value]);
  }
  const typed = types !== undefined && types.length === own.length;
  const headers: Record<string, unknown> = {};
  own.forEach(([name, text], index) => {
    // Own properties only, defined rather than assigned: a header named `constructor` or
    // `__proto__` is a header like any other.
    if (Object.hasOwn(headers, name)) return;
    Object.defineProperty(headers, name, {
      value: typed ? decodeValue(types![index] as TypeCode, text) : text,
      enumerable: true,
      writable: true,
      configurable: true,
    });
  });
  return headers;
}

/** A message's headers as {@link decodeHeaders} gives them, or why they cannot be read. */
export type ReadHeaders =
  | { readonly headers: Record<string, unknown>; readonly problem?: undefined }
  | { readonly headers: Record<string, never>; readonly problem: string };

/** Why a message whose headers the client cannot read (see readHeaders) is a dead letter. */
export function unreadableHeadersReason(problem: string): string {
  return `malformed-header: its NATS headers cannot be read (${problem})`;
}

/**
 * The headers `read` gives (a received or stored message's), decoded; when the NATS client cannot
 * read them (a header name with a space or a byte outside ASCII, which other clients can send and
 * the server stores), none, and the client's reason.
 */
export function readHeaders(
  read: () => Iterable<readonly [string, readonly string[]]> | undefined,
): ReadHeaders {
  try {
    return { headers: decodeHeaders(read() ?? []) };
  } catch (error) {
    return { headers: {}, problem: errorMessage(error) };
  }
}

/**
 * A number as `String()` writes one (how `encodeValue` sends it): no leading zeros, spaces, hex
 * or unsigned exponents. Any other text typed `n` (another program's) stays text, for the header
 * checks to judge as they would a string, not slip through as the number `Number()` makes of it.
 */
const NUMBER_TEXT = /^(-?(0|[1-9]\d*)(\.\d+)?(e[+-][1-9]\d*)?|-?Infinity|NaN)$/;

function decodeValue(code: TypeCode, text: string): unknown {
  switch (code) {
    case 'n':
      return NUMBER_TEXT.test(text) ? Number(text) : text;
    case 'b':
      return text === 'true';
    case 'j':
      try {
        return JSON.parse(text) as unknown;
      } catch {
        return text;
      }
    default:
      return text;
  }
}

/** Bytes of the header block NATS writes for `pairs` (`NATS/1.0`, `name: value` lines, the end). */
export function encodedHeaderBytes(pairs: ReadonlyArray<readonly [string, string]>): number {
  if (pairs.length === 0) return 0;
  let bytes = 'NATS/1.0'.length + 4;
  for (const [name, value] of pairs) {
    bytes += 4 + Buffer.byteLength(name) + Buffer.byteLength(value);
  }
  return bytes;
}

/** As long as any `Nats-Msg-Id` the transport sends (a UUID), to count its bytes ahead of time. */
const MSG_ID_SIZED = '00000000-0000-0000-0000-000000000000';
/** A reason is cut to no less than this many characters before other headers are left out. */
const SHORT_REASON_CHARS = 40;

/** Bytes of the header block NATS writes for `headers` and a `Nats-Msg-Id` (0: not encodable). */
function forwardedHeaderBytes(headers: Readonly<Record<string, unknown>>): number {
  const encoded = encodeHeaders(headers);
  if (encoded.problem !== undefined) return 0; // send() refuses it with its reason
  return encodedHeaderBytes([...encoded.pairs, [MSG_ID_HEADER, MSG_ID_SIZED]]);
}

/** `text` cut to at most `chars` characters, an ellipsis last when it was cut. */
function cut(text: string, chars: number): string {
  const characters = [...text];
  if (characters.length <= chars) return text;
  return chars === 0 ? '' : `${characters.slice(0, chars - 1).join('')}…`;
}

/**
 * The headers of a message the transport forwards on its own (a dead letter, a copy requeued at
 * the tail) cut to fit the server's `max_payload` with its body: the server already holds the
 * message, so the forward must not be refused for the headers it adds. `room` is `max_payload`
 * less the body's bytes. The message's own headers matter most (a replay needs them): while the
 * whole does not fit, `reason` (`x-death-reason`) is cut, keeping its first 40 characters; then
 * the largest other headers are left out (except those in `keep`), their names listed in
 * `dropped` (`x-dropped-headers`); then `reason` is cut further. Gives the headers unchanged when
 * they fit, undefined when nothing makes them fit (a body of nearly `max_payload`).
 */
export function fitForwardedHeaders(
  headers: Readonly<Record<string, unknown>>,
  room: number,
  names: { readonly reason: string; readonly dropped: string; readonly keep: readonly string[] },
): Readonly<Record<string, unknown>> | undefined {
  if (forwardedHeaderBytes(headers) <= room) return headers;
  const fitted: Record<string, unknown> = { ...headers };
  const fits = () => forwardedHeaderBytes(fitted) <= room;
  const reason = fitted[names.reason];
  /** Cuts the reason until the whole fits, or it is down to `floor` characters. */
  const cutReason = (floor: number) => {
    if (typeof reason !== 'string') return;
    // Each character is at least a byte: cutting as many as the excess (and the ellipsis) nears it.
    let chars = [...String(fitted[names.reason])].length;
    while (!fits() && chars > floor) {
      chars = Math.max(floor, chars - (forwardedHeaderBytes(fitted) - room) - 3);
      fitted[names.reason] = cut(reason, chars);
    }
  };
  cutReason(SHORT_REASON_CHARS);
  const earlier = fitted[names.dropped];
  const dropped: string[] = [];
  const sizes = new Map(
    Object.entries(fitted)
      .filter(([, value]) => value !== undefined)
      .map(([name, value]) => [name, forwardedHeaderBytes({ [name]: value })]),
  );
  leaveOutLargest(sizes, [names.reason, names.dropped, ...names.keep], fits, (name) => {
    delete fitted[name];
    dropped.push(name);
    fitted[names.dropped] = droppedHeadersList(earlier, dropped);
  });
  cutReason(0);
  return fits() ? fitted : undefined;
}
