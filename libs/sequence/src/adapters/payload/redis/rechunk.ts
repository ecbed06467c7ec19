import type { Readable } from 'node:stream';
import { byteChunk } from '../../../core/payload-source';

/**
 * Cuts a byte source of arbitrary piece sizes into pieces of exactly `size` bytes (the last one
 * shorter, never empty). It holds less than one output piece plus the source's current piece:
 * it pulls the next source piece only when its consumer asks for the next output piece, so the
 * consumer's awaits are the back-pressure on the source.
 */
export async function* rechunk(source: Buffer | Readable, size: number): AsyncGenerator<Buffer> {
  let parts: Buffer[] = [];
  let held = 0;
  const pieces: AsyncIterable<unknown> | Iterable<unknown> = Buffer.isBuffer(source)
    ? [source]
    : source;
  for await (const piece of pieces) {
    let rest = byteChunk(piece);
    while (held + rest.length >= size) {
      const take = size - held;
      parts.push(rest.subarray(0, take));
      yield parts.length === 1 ? parts[0] : Buffer.concat(parts, size);
      parts = [];
      held = 0;
      rest = rest.subarray(take);
    }
    if (rest.length > 0) {
      parts.push(rest);
      held += rest.length;
    }
  }
  if (held > 0) yield Buffer.concat(parts, held);
}
