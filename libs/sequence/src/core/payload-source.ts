import { Readable } from 'node:stream';

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

/**
 * A chunk of a payload stream as bytes: a string as UTF-8, a typed array as a view of its bytes.
 * Anything else (an object-mode stream's objects) is a TypeError.
 */
export function byteChunk(chunk: unknown): Buffer {
  if (Buffer.isBuffer(chunk)) return chunk;
  if (typeof chunk === 'string') return Buffer.from(chunk);
  // `ArrayBuffer.isView` rather than `instanceof`: typed arrays from another realm fail it.
  if (ArrayBuffer.isView(chunk))
    return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
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
