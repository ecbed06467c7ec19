import { InvalidHeaderError } from '../core/errors/invalid-header.error';
import { MAX_HEADER_NAME_BYTES } from '../core/headers';

/*
 * The headers every transport carries: those RabbitMQ (amqplib) can encode. The in-memory
 * transport refuses the others too, so that what works on the embedded defaults works on the
 * broker.
 */

/**
 * amqplib encodes a message's properties, headers included, into one 64 KiB scratch buffer, and
 * past its end it truncates a string without saying so (a malformed frame). Headers are refused
 * well before that.
 */
export const MAX_ENCODED_HEADER_BYTES = 60 * 1024;
/** At and above this magnitude amqplib sends a number as a 64-bit integer (see its codec). */
const INTEGER_FROM = 2 ** 50;
const INT64_MIN = -(2 ** 63);

/**
 * Throws {@link InvalidHeaderError} for headers amqplib would fail to encode. Such a failure is
 * not only this message's: amqplib registers the confirm callback before it encodes, so a throw
 * there leaves a callback that no message owns, and every later confirm on the channel would be
 * credited to the message before it. Checked before anything is handed to the channel, down to
 * the values inside tables and arrays (those of a message another program published, which a
 * dead letter carries on).
 */
export function assertEncodableHeaders(channel: string, headers: Record<string, unknown>): void {
  let bytes = 0;
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    const nameBytes = Buffer.byteLength(name);
    if (nameBytes > MAX_HEADER_NAME_BYTES) {
      throw new InvalidHeaderError(
        channel,
        `${name.slice(0, 40)}…`,
        `has a name of ${nameBytes} bytes; AMQP carries at most ${MAX_HEADER_NAME_BYTES}`,
      );
    }
    const problem = valueProblem(value, 0);
    if (problem) throw new InvalidHeaderError(channel, name, problem);
    bytes += 1 + nameBytes + encodedBytes(value);
  }
  if (bytes > MAX_ENCODED_HEADER_BYTES) {
    throw new InvalidHeaderError(
      channel,
      '',
      `take ${bytes} bytes encoded; at most ${MAX_ENCODED_HEADER_BYTES} are sent (put large ` +
        'values in the body)',
    );
  }
}

/** Header a forwarded message carries when headers had to be left out: their names. */
export const DROPPED_HEADERS_HEADER = 'x-dropped-headers';
/** Longest description that replaces a value amqplib cannot encode in a forwarded message. */
const MAX_REPLACEMENT_CHARS = 200;

/**
 * `headers` as a message the transport forwards on its own (a dead letter, a copy requeued behind
 * the queued ones) can always carry them, for a message another program published: a value
 * amqplib cannot encode is replaced by a string saying why, a name AMQP cannot carry is left out,
 * and while the whole is over {@link MAX_ENCODED_HEADER_BYTES} the largest values are left out,
 * except those named in `keep`. Names left out are listed in {@link DROPPED_HEADERS_HEADER}.
 * Headers that were fine come back as they were, the same object.
 */
export function forwardableHeaders(
  headers: Record<string, unknown>,
  keep: readonly string[] = [],
): Record<string, unknown> {
  const kept = new Map<string, unknown>();
  const dropped: string[] = [];
  let changed = false;
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    if (Buffer.byteLength(name) > MAX_HEADER_NAME_BYTES) {
      dropped.push(`${name.slice(0, 40)}…`);
      continue;
    }
    const problem = valueProblem(value, 0);
    if (problem) {
      kept.set(name, `(not forwarded: ${problem})`.slice(0, MAX_REPLACEMENT_CHARS));
      changed = true;
    } else {
      kept.set(name, value);
    }
  }
  const size = (): number => {
    let bytes = 0;
    for (const [name, value] of kept) bytes += 1 + Buffer.byteLength(name) + encodedBytes(value);
    if (dropped.length > 0) bytes += 1 + DROPPED_HEADERS_HEADER.length + droppedList().length + 5;
    return bytes;
  };
  const droppedList = (): string => dropped.join(',').slice(0, 1_000);
  while (size() > MAX_ENCODED_HEADER_BYTES) {
    let largest: string | undefined;
    let largestBytes = -1;
    for (const [name, value] of kept) {
      if (keep.includes(name)) continue;
      const bytes = encodedBytes(value);
      if (bytes > largestBytes) [largest, largestBytes] = [name, bytes];
    }
    if (largest === undefined) break;
    kept.delete(largest);
    dropped.push(largest);
  }
  if (!changed && dropped.length === 0) return headers;
  const forwarded = Object.fromEntries(kept);
  if (dropped.length > 0) forwarded[DROPPED_HEADERS_HEADER] = droppedList();
  return forwarded;
}

/** Nesting amqplib is asked to encode at most (a broker's x-death is two levels deep). */
const MAX_DEPTH = 32;

/** Why amqplib would fail to encode `value` as a field value, or undefined when it would not. */
function valueProblem(value: unknown, depth: number): string | undefined {
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return undefined;
  if (Buffer.isBuffer(value)) return undefined;
  if (typeof value === 'number') return numberProblem(value);
  if (typeof value !== 'object') return `is a ${typeof value}, which AMQP does not carry`;
  if (depth >= MAX_DEPTH) return `nests deeper than ${MAX_DEPTH} levels`;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const element: unknown = value[i];
      if (element === undefined) return `holds undefined at [${i}]`;
      const problem = valueProblem(element, depth + 1);
      if (problem) return `holds a value at [${i}] that ${problem}`;
    }
    return undefined;
  }
  // amqplib reads a table with a field '!' as a typed value ({ '!': type, value }), and calls
  // each table's own hasOwnProperty.
  for (const trap of ['!', 'hasOwnProperty']) {
    if (Object.prototype.hasOwnProperty.call(value, trap)) {
      return `is a table with a field named ${trap}, which amqplib cannot send`;
    }
  }
  for (const name in value) {
    const field: unknown = (value as Record<string, unknown>)[name];
    if (field === undefined) continue;
    if (Buffer.byteLength(name) > MAX_HEADER_NAME_BYTES) {
      return `is a table with a field name over ${MAX_HEADER_NAME_BYTES} bytes`;
    }
    const problem = valueProblem(field, depth + 1);
    if (problem) return `holds a field ${name.slice(0, 40)} that ${problem}`;
  }
  return undefined;
}

function numberProblem(value: number): string | undefined {
  if (!Number.isFinite(value)) return `is ${value}, not a finite number`;
  if (Math.abs(value) >= INTEGER_FROM && !Number.isInteger(value)) {
    return `is ${value}: a fraction of that magnitude cannot be sent (AMQP sends it as an integer)`;
  }
  if (value < INT64_MIN) return `is ${value}, below the smallest 64-bit integer`;
  return undefined;
}

/** An upper bound of a field value's encoded size (type tag included). */
function encodedBytes(value: unknown): number {
  if (typeof value === 'string') return 5 + Buffer.byteLength(value);
  if (Buffer.isBuffer(value)) return 5 + value.length;
  if (typeof value === 'number' || typeof value === 'bigint') return 9;
  if (typeof value === 'boolean' || value === null) return 2;
  // Tables and arrays the broker added (x-death): their JSON is a fair upper bound.
  return 5 + Buffer.byteLength(JSON.stringify(value) ?? '');
}
