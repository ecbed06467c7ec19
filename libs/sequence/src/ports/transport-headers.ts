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
 * credited to the message before it. Checked before anything is handed to the channel.
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
    if (typeof value === 'number') {
      const problem = numberProblem(value);
      if (problem) throw new InvalidHeaderError(channel, name, problem);
    }
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
