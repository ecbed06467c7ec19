import { Readable } from 'node:stream';
import { kindOf } from './objects';

/**
 * Records to pack whole into fragments (record-aware mode): a record is never cut across two
 * fragments unless it alone exceeds the fragment size. The payload is their concatenation.
 */
export interface RecordSource {
  readonly records: Iterable<Uint8Array> | AsyncIterable<Uint8Array>;
}

/**
 * What `SplitterService.send` accepts (and `ClaimCheckService.publish` in `mode: 'auto'`):
 * - a `Buffer` / `Uint8Array` (size known: every fragment carries `x-sequence-size`);
 * - a `Readable` or `AsyncIterable` of byte chunks of unknown length (streaming mode: the size
 *   travels on the last fragment only);
 * - a {@link RecordSource} (record-aware, streaming mode).
 */
export type SequencePayload = Uint8Array | Readable | AsyncIterable<Uint8Array> | RecordSource;

/** Whether a payload is a {@link RecordSource}. */
export function isRecordSource(payload: unknown): payload is RecordSource {
  return (
    typeof payload === 'object' &&
    payload !== null &&
    'records' in payload &&
    !(payload instanceof Readable)
  );
}

/** What a call takes as its payload: `send()`, Claim Check's `publish()`, its `checkIn()`. */
export type PayloadTaker = 'send' | 'publish' | 'checkIn';

const TAKES: Record<PayloadTaker, string> = {
  send:
    'a Buffer or Uint8Array, a Readable, an AsyncIterable of byte chunks, or { records } (an ' +
    'Iterable or AsyncIterable of them)',
  publish:
    'a Buffer or Uint8Array, a Readable, or { records } (an Iterable or AsyncIterable of them)',
  checkIn: 'a Buffer or Uint8Array, or a Readable',
};

/**
 * Why `payload` is not one `taker` takes, or `undefined` when it is: checked before the call
 * starts, so that a value of another type (from JavaScript, or cast) is refused as an option is,
 * instead of failing as a source once under way. A string is refused too: iterated, it would
 * travel one character per chunk.
 */
export function payloadProblem(payload: unknown, taker: PayloadTaker): string | undefined {
  if (ArrayBuffer.isView(payload) || payload instanceof Readable) return undefined;
  const records = isRecordSource(payload) && taker !== 'checkIn';
  if (records) {
    if (isIterable(payload.records)) return undefined;
  } else if (taker === 'send' && isIterable(payload) && !Array.isArray(payload)) {
    return undefined;
  }
  const got = records
    ? `records of type ${kindOf(payload.records)}`
    : Array.isArray(payload)
      ? 'an array'
      : kindOf(payload);
  const hint = typeof payload === 'string' ? ': pass Buffer.from(text)' : '';
  return `payload must be ${TAKES[taker]}, got ${got}${hint}`;
}

/** A payload's bytes as a Buffer when it is a Uint8Array (or another view): no copy. */
export function asBufferPayload(payload: ArrayBufferView): Buffer;
export function asBufferPayload<T>(payload: T): T | Buffer;
export function asBufferPayload<T>(payload: T): T | Buffer {
  if (!ArrayBuffer.isView(payload) || Buffer.isBuffer(payload)) return payload;
  return Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
}

function isIterable(value: unknown): boolean {
  if (typeof value !== 'object' || value === null) return false;
  const candidate = value as Partial<Record<symbol, unknown>>;
  return (
    typeof candidate[Symbol.asyncIterator] === 'function' ||
    typeof candidate[Symbol.iterator] === 'function'
  );
}

/**
 * A chunk of a payload stream as bytes: a string as UTF-8, a typed array as a view of its bytes.
 * Anything else (an object-mode stream's objects) is a TypeError.
 */
export function byteChunk(chunk: unknown): Buffer {
  if (Buffer.isBuffer(chunk)) return chunk;
  if (typeof chunk === 'string') return Buffer.from(chunk);
  // `ArrayBuffer.isView` rather than `instanceof`: typed arrays from another realm fail it.
  if (ArrayBuffer.isView(chunk)) return asBufferPayload(chunk);
  throw new TypeError(
    `expected byte chunks (Buffer, Uint8Array or string), got ${chunk === null ? 'null' : typeof chunk}; ` +
      'an object-mode stream cannot be a payload',
  );
}

/**
 * A `pipeline` stage that passes a payload stream's chunks on as bytes ({@link byteChunk}), for a
 * stream piped into a byte sink (a file, a Transform): such a sink throws on an object inside the
 * pipe's own `'data'` handler, an uncaught exception that also ends the sink cleanly, cut short.
 * Here the TypeError fails the pipeline instead.
 */
export async function* byteChunks(chunks: AsyncIterable<unknown>): AsyncGenerator<Buffer> {
  for await (const chunk of chunks) yield byteChunk(chunk);
}

/**
 * The chunks of `source`, held to the size its sender declared: a RangeError as soon as they
 * pass `bytes`, or at their end if they fall short, so that a size that decided how the payload
 * travels cannot be wrong.
 */
export async function* declaredBytes(
  source: Iterable<unknown> | AsyncIterable<unknown>,
  bytes: number,
): AsyncGenerator<Buffer> {
  let seen = 0;
  for await (const chunk of source) {
    const body = byteChunk(chunk);
    seen += body.length;
    if (seen > bytes) {
      throw new RangeError(`the payload is longer than its declared bytes (${bytes})`);
    }
    yield body;
  }
  if (seen !== bytes) {
    throw new RangeError(`the payload is ${seen} bytes, not its declared ${bytes}`);
  }
}
