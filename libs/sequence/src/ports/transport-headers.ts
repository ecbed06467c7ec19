import { textOf } from '../core/errors/caught';
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
 * dead letter carries on), with amqplib's own rules and sizes.
 */
export function assertEncodableHeaders(channel: string, headers: Record<string, unknown>): void {
  const encoded = encodedHeaders(headers);
  if ('problem' in encoded) throw new InvalidHeaderError(channel, encoded.name, encoded.problem);
  const bytes = encoded.bytes - TABLE_LENGTH_BYTES;
  if (bytes > MAX_ENCODED_HEADER_BYTES) {
    throw new InvalidHeaderError(
      channel,
      '',
      `take ${bytes} bytes encoded; at most ${MAX_ENCODED_HEADER_BYTES} are sent (put large ` +
        'values in the body)',
    );
  }
}

/** The length that starts an encoded field table. */
const TABLE_LENGTH_BYTES = 4;

/**
 * What amqplib writes for `headers` as a field table: its bytes (the table's length included),
 * or the first header it could not encode and why.
 */
export function encodedHeaders(
  headers: Record<string, unknown>,
): { readonly bytes: number } | { readonly name: string; readonly problem: string } {
  let bytes = TABLE_LENGTH_BYTES;
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    const nameBytes = Buffer.byteLength(name);
    if (nameBytes > MAX_HEADER_NAME_BYTES) {
      return {
        name: `${name.slice(0, 40)}…`,
        problem: `has a name of ${nameBytes} bytes; AMQP carries at most ${MAX_HEADER_NAME_BYTES}`,
      };
    }
    const field = fieldValue(value, 0);
    if (field.problem !== undefined) return { name, problem: field.problem };
    bytes += 1 + nameBytes + field.bytes;
  }
  return { bytes };
}

/** Header a forwarded message carries when headers had to be left out: their names. */
export const DROPPED_HEADERS_HEADER = 'x-dropped-headers';
/** Longest description that replaces a value amqplib cannot encode in a forwarded message. */
const MAX_REPLACEMENT_CHARS = 200;
/** Longest {@link DROPPED_HEADERS_HEADER} value. */
const MAX_DROPPED_LIST_CHARS = 1_000;

/**
 * The value of {@link DROPPED_HEADERS_HEADER} for a forward that leaves out `dropped`: the names
 * an earlier forward left out (its value, `earlier`) and these, comma-separated, as many whole
 * names as fit in {@link MAX_DROPPED_LIST_CHARS}.
 */
export function droppedHeadersList(earlier: unknown, dropped: readonly string[]): string {
  let list = typeof earlier === 'string' ? earlier.slice(0, MAX_DROPPED_LIST_CHARS) : '';
  for (const name of dropped) {
    const longer = list ? `${list},${name}` : name;
    if (longer.length > MAX_DROPPED_LIST_CHARS) break;
    list = longer;
  }
  return list;
}

/**
 * Leaves out headers of a forward, the largest first (of equal ones, the first), none named in
 * `keep`, until `fits()`: `sizes` are their sizes by name, `leaveOut` takes each one out (and
 * names it in {@link DROPPED_HEADERS_HEADER}, which `fits` counts).
 */
export function leaveOutLargest(
  sizes: ReadonlyMap<string, number>,
  keep: readonly string[],
  fits: () => boolean,
  leaveOut: (name: string) => void,
): void {
  const largestFirst = [...sizes]
    .filter(([name]) => !keep.includes(name))
    .sort(([, a], [, b]) => b - a);
  for (const [name] of largestFirst) {
    if (fits()) return;
    leaveOut(name);
  }
}

/**
 * `headers` as a message the transport forwards on its own (a dead letter, a copy requeued behind
 * the queued ones) can always carry them, for a message another program published: a value
 * amqplib cannot encode is replaced by a string saying why, a name AMQP cannot carry is left out,
 * and while the whole is over {@link MAX_ENCODED_HEADER_BYTES} the largest values are left out,
 * except those named in `keep`. Names left out are added to {@link DROPPED_HEADERS_HEADER} (to
 * the names an earlier forward left out, if any). Headers that were fine come back as they were,
 * the same object.
 */
export function forwardableHeaders(
  headers: Record<string, unknown>,
  keep: readonly string[] = [],
): Record<string, unknown> {
  const kept = new Map<string, { value: unknown; bytes: number }>();
  const dropped: string[] = [];
  let changed = false;
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || name === DROPPED_HEADERS_HEADER) continue;
    const nameBytes = Buffer.byteLength(name);
    if (nameBytes > MAX_HEADER_NAME_BYTES) {
      dropped.push(`${name.slice(0, 40)}…`);
      continue;
    }
    const field = fieldValue(value, 0);
    if (field.problem === undefined) {
      kept.set(name, { value, bytes: 1 + nameBytes + field.bytes });
    } else {
      const replacement = `(not forwarded: ${field.problem})`.slice(0, MAX_REPLACEMENT_CHARS);
      kept.set(name, { value: replacement, bytes: 6 + nameBytes + Buffer.byteLength(replacement) });
      changed = true;
    }
  }
  const droppedList = (): string => droppedHeadersList(headers[DROPPED_HEADERS_HEADER], dropped);
  const size = (): number => {
    let bytes = 0;
    for (const { bytes: each } of kept.values()) bytes += each;
    const list = droppedList();
    if (list) bytes += 6 + DROPPED_HEADERS_HEADER.length + Buffer.byteLength(list);
    return bytes;
  };
  leaveOutLargest(
    new Map([...kept].map(([name, { bytes }]) => [name, bytes])),
    keep,
    () => size() <= MAX_ENCODED_HEADER_BYTES,
    (name) => {
      kept.delete(name);
      dropped.push(name);
    },
  );
  if (!changed && dropped.length === 0) return headers;
  const forwarded: Record<string, unknown> = {};
  for (const [name, { value }] of kept) forwarded[name] = value;
  const list = droppedList();
  if (list) forwarded[DROPPED_HEADERS_HEADER] = list;
  return forwarded;
}

/** Nesting amqplib is asked to encode at most (a broker's x-death is two levels deep). */
const MAX_DEPTH = 32;

/** A field value as amqplib's encoder sees it: its encoded size (type tag included), or why not. */
type Field =
  { readonly bytes: number; readonly problem?: undefined } | { readonly problem: string };

const INT64_MAX = 2 ** 63;
const UINT64_MAX = 2 ** 64;

/**
 * What amqplib's encodeFieldValue does with `value`: a table with a field '!' is its typed form
 * (`{ '!': 'timestamp', value }`, which is also how it decodes timestamps and decimals); other
 * values are typed by their JavaScript type, numbers by their range.
 */
function fieldValue(value: unknown, depth: number): Field {
  if (typeof value === 'object' && value !== null) {
    // amqplib asks every object value.hasOwnProperty('!'): one without that method throws.
    const own = (value as { hasOwnProperty?: unknown }).hasOwnProperty;
    if (typeof own !== 'function') {
      return { problem: 'is a table without a hasOwnProperty method, which amqplib cannot read' };
    }
    if ((own as (key: string) => boolean).call(value, '!')) {
      const typed = value as { '!': unknown; value: unknown };
      return typedValue(typed['!'], typed.value, depth);
    }
    return objectValue(value, depth);
  }
  switch (typeof value) {
    case 'object': // null
      return { bytes: 1 };
    case 'string':
      return { bytes: 5 + Buffer.byteLength(value) };
    case 'boolean':
      return { bytes: 2 };
    case 'number': {
      const problem = numberProblem(value);
      return problem === undefined ? { bytes: 1 + numberBytes(value) } : { problem };
    }
    default:
      return { problem: `is a ${typeof value}, which AMQP does not carry` };
  }
}

function objectValue(value: object | null, depth: number): Field {
  if (value === null) return { bytes: 1 };
  if (Buffer.isBuffer(value)) return { bytes: 5 + value.length };
  if (depth >= MAX_DEPTH) return { problem: `nests deeper than ${MAX_DEPTH} levels` };
  let bytes = 5;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const element = fieldValue(value[i], depth + 1);
      if (element.problem !== undefined) {
        return { problem: `holds a value at [${i}] that ${element.problem}` };
      }
      bytes += element.bytes;
    }
    return { bytes };
  }
  // amqplib walks a table with for...in and leaves undefined fields out.
  for (const name in value) {
    const raw: unknown = (value as Record<string, unknown>)[name];
    if (raw === undefined) continue;
    const nameBytes = Buffer.byteLength(name);
    if (nameBytes > MAX_HEADER_NAME_BYTES) {
      return { problem: `is a table with a field name over ${MAX_HEADER_NAME_BYTES} bytes` };
    }
    const field = fieldValue(raw, depth + 1);
    if (field.problem !== undefined) {
      return { problem: `holds a field ${name.slice(0, 40)} that ${field.problem}` };
    }
    bytes += 1 + nameBytes + field.bytes;
  }
  return { bytes };
}

/** amqplib's typed form `{ '!': type, value }`: the types its encoder knows, in their ranges. */
function typedValue(type: unknown, value: unknown, depth: number): Field {
  const inRange = (min: number, max: number, bytes: number): Field =>
    typeof value === 'number' && value >= min && value <= max
      ? { bytes: 1 + bytes }
      : { problem: `is a ${textOf(type)} of ${textOf(value).slice(0, 40)}, out of its range` };
  const integer = (min: number, max: number): Field =>
    typeof value === 'number' && Number.isInteger(value) && value >= min && value < max
      ? { bytes: 9 }
      : { problem: `is a ${textOf(type)} of ${textOf(value).slice(0, 40)}, not such an integer` };
  switch (type) {
    case 'string':
      return typeof value === 'string'
        ? { bytes: 5 + Buffer.byteLength(value) }
        : { problem: 'is a typed string whose value is not a string' };
    case 'object':
      return typeof value === 'object'
        ? objectValue(value, depth)
        : { problem: 'is a typed object whose value is not an object' };
    case 'boolean':
      return typeof value === 'boolean'
        ? { bytes: 2 }
        : { problem: 'is a typed boolean whose value is not a boolean' };
    case 'double':
    case 'float64':
      return inRange(-Infinity, Infinity, 8);
    case 'float':
      return inRange(-Infinity, Infinity, 4);
    case 'byte':
    case 'int8':
      return inRange(-0x80, 0x7f, 1);
    case 'unsignedbyte':
    case 'uint8':
      return inRange(0, 0xff, 1);
    case 'short':
    case 'int16':
      return inRange(-0x8000, 0x7fff, 2);
    case 'unsignedshort':
    case 'uint16':
      return inRange(0, 0xffff, 2);
    case 'int':
    case 'int32':
      return inRange(-0x80000000, 0x7fffffff, 4);
    case 'unsignedint':
    case 'uint32':
      return inRange(0, 0xffffffff, 4);
    case 'long':
    case 'int64':
      return integer(-INT64_MAX, INT64_MAX);
    case 'timestamp':
      return integer(0, UINT64_MAX);
    case 'decimal': {
      const decimal = value as { places?: unknown; digits?: unknown } | null;
      const places = decimal?.places;
      const digits = decimal?.digits;
      return typeof places === 'number' &&
        places >= 0 &&
        places < 256 &&
        typeof digits === 'number' &&
        digits >= 0 &&
        digits <= 0xffffffff
        ? { bytes: 6 }
        : { problem: 'is a decimal without places 0-255 and digits 0-2^32-1' };
    }
    default:
      return {
        problem: `is a typed value of type ${textOf(type).slice(0, 40)}, which amqplib cannot send`,
      };
  }
}

/** Bytes amqplib writes for an untyped number after its type tag (see its encodeFieldValue). */
function numberBytes(value: number): number {
  const floating =
    value >= 0x8000000000000000 ||
    (Math.abs(value) < 0x4000000000000 && Math.floor(value) !== value);
  if (floating) return 8;
  if (value < 128 && value >= -128) return 1;
  if (value >= -0x8000 && value < 0x8000) return 2;
  if (value >= -0x80000000 && value < 0x80000000) return 4;
  return 8;
}

function numberProblem(value: number): string | undefined {
  if (!Number.isFinite(value)) return `is ${value}, not a finite number`;
  if (Math.abs(value) >= INTEGER_FROM && !Number.isInteger(value)) {
    return `is ${value}: a fraction of that magnitude cannot be sent (AMQP sends it as an integer)`;
  }
  if (value < INT64_MIN) return `is ${value}, below the smallest 64-bit integer`;
  return undefined;
}
