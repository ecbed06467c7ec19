/**
 * The baseline of the Claim Check benchmark: plain Node, no library, no Nest.
 *
 * - writer: the generated stream → a Transform that SHA-256-hashes and counts each chunk →
 *   `fs.createWriteStream` of a new file, through `stream.pipeline` (the same shape as the
 *   library's checkIn into the filesystem store, without its temporary name, metadata files and
 *   rename).
 * - reader: `fs.createReadStream` of that file (64 KiB chunks, Node's default, as the store's
 *   own read stream) read to the end with `for await`, hashing every chunk; then the hash and
 *   byte count are compared with the writer's, and the file is deleted (after the clock stopped).
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { unlink } from 'node:fs/promises';
import { Readable, Transform, type TransformCallback } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { Role } from './claim-check.child';
import { generatedPayload, payloadBlock } from './claim-check.payload';
import type { ChildConfig } from './claim-check.protocol';

/** Marks: `start` (the command arrived), `written` (the file is closed). */
export function startWriter(config: ChildConfig): Role {
  const block = payloadBlock(config.seed, config.chunkBytes);
  return {
    async handle(message, run) {
      if (message.type !== 'write') throw new Error(`the writer cannot ${message.type}`);
      run.mark('start');
      const hash = createHash('sha256');
      let bytes = 0;
      const meter = new Transform({
        transform(chunk: Buffer, _encoding: BufferEncoding, done: TransformCallback) {
          hash.update(chunk);
          bytes += chunk.length;
          done(null, chunk);
        },
      });
      await pipeline(
        Readable.from(generatedPayload(run.bytes, block), { objectMode: false }),
        meter,
        createWriteStream(message.path, { flags: 'wx', mode: 0o600 }),
      );
      run.mark('written');
      run.stored(bytes, hash.digest('hex'), message.path);
      run.settle();
    },
    stop: async () => undefined,
  };
}

/** Marks: `start` (the command arrived), `readEnd` (the last byte), `deleteEnd`. */
export function startReader(): Role {
  return {
    async handle(message, run) {
      if (message.type !== 'read') throw new Error(`the reader cannot ${message.type}`);
      run.mark('start');
      const hash = createHash('sha256');
      let bytes = 0;
      let chunks = 0;
      for await (const chunk of createReadStream(message.path)) {
        hash.update(chunk as Buffer);
        bytes += (chunk as Buffer).length;
        chunks++;
      }
      run.mark('readEnd');
      const sha256 = hash.digest('hex');
      if (sha256 !== message.sha256 || bytes !== message.bytes) {
        throw new Error(
          `read ${bytes} bytes with SHA-256 ${sha256}; the writer wrote ${message.bytes} ` +
            `with ${message.sha256}`,
        );
      }
      run.done(bytes);
      await unlink(message.path);
      run.mark('deleteEnd');
      run.chunks = chunks;
      run.settle();
    },
    stop: async () => undefined,
  };
}
