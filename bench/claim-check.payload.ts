/**
 * The benchmark's payload: a stream of `total` bytes generated chunk by chunk from a seed, so
 * that the baseline writer and the module sender, each in its own process, produce the very same
 * bytes without either ever holding the whole payload.
 */
import { createHash } from 'node:crypto';

/** `chunkBytes` pseudo-random bytes derived from `seedHex` (SHAKE-256): the same seed, the same block. */
export function payloadBlock(seedHex: string, chunkBytes: number): Buffer {
  return createHash('shake256', { outputLength: chunkBytes })
    .update(Buffer.from(seedHex, 'hex'))
    .digest();
}

/**
 * `total` bytes as fresh chunks of `block.length` bytes (the last one shorter), as a file or a
 * socket would hand them over: each chunk is a new Buffer, a copy of the block with its index in
 * the first 8 bytes so that no two chunks are alike.
 */
export async function* generatedPayload(total: number, block: Buffer): AsyncGenerator<Buffer> {
  let index = 0n;
  for (let produced = 0; produced < total; produced += block.length) {
    const chunk = Buffer.from(block.subarray(0, Math.min(block.length, total - produced)));
    if (chunk.length >= 8) chunk.writeBigUInt64BE(index);
    index++;
    yield chunk;
  }
}
