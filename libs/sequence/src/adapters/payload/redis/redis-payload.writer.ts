import type { Readable } from 'node:stream';
import type { PutOptions } from '../../../ports/payload-store.port';
import { execBatch, KEY_BATCH, unindexPayload, unlinkPayload } from './redis-payload.commands';
import type { MetaField, PayloadIndexKeys, PayloadKeys } from './redis-payload-keys';
import type { RedisPayloadClient } from './redis-payload.options';
import { RedisPayloadStoreError } from './redis-payload-store.error';
import { rechunk } from './rechunk';

/** What `writePayload` needs beyond the caller's put options. */
export interface PayloadWrite extends PutOptions {
  readonly ref: string;
  readonly keys: PayloadKeys;
  readonly index: PayloadIndexKeys;
  readonly chunkBytes: number;
  /** TTL of every key of the payload (the index sets: at least this). */
  readonly ttlMs: number;
}

/**
 * Writes one payload (see the top of redis.payload-store.ts for the protocol): meta with
 * state=writing, the chunks, then the commit. Resolves the bytes written. On any failure (the
 * source's, Redis's) it removes what it wrote, best effort, and rejects with that failure.
 */
export async function writePayload(
  redis: RedisPayloadClient,
  source: Buffer | Readable,
  write: PayloadWrite,
): Promise<number> {
  const { ref, keys, ttlMs } = write;
  let chunks = 0;
  let bytes = 0;
  let writing: Promise<unknown> | undefined;
  try {
    await execBatch(
      redis
        .multi()
        .hset(keys.meta, { state: 'writing', createdAt: write.now })
        .pexpire(keys.meta, ttlMs),
      'put',
      ref,
    );
    // One chunk travels to Redis while the next is cut from the source: about two in memory.
    for await (const chunk of rechunk(source, write.chunkBytes)) {
      await writing;
      writing = redis.set(keys.chunk(chunks), chunk, 'PX', ttlMs);
      // Awaited on the next turn or below; a failure meanwhile must not count as unhandled.
      writing.catch(() => undefined);
      chunks += 1;
      bytes += chunk.length;
    }
    await writing;
    await commit(redis, write, bytes, chunks);
    return bytes;
  } catch (error) {
    await writing?.catch(() => undefined);
    // Best effort: whatever is left has a TTL and is in no index, so no get or sweep finds it.
    await unlinkPayload(redis, keys, chunks).catch(() => undefined);
    await unindexPayload(redis, write.index, ref).catch(() => undefined);
    throw error;
  }
}

/** Aligns the chunks' TTLs, flips the meta to ready, then lists the payload for sweeping. */
async function commit(
  redis: RedisPayloadClient,
  write: PayloadWrite,
  bytes: number,
  chunks: number,
): Promise<void> {
  const { ref, keys, ttlMs } = write;
  // Also proves every chunk is still there: PEXPIRE answers 0 for a key that expired meanwhile.
  for (let from = 0; from < chunks; from += KEY_BATCH) {
    const batch = redis.pipeline();
    for (let index = from; index < Math.min(chunks, from + KEY_BATCH); index++) {
      batch.pexpire(keys.chunk(index), ttlMs);
    }
    const missing = (await execBatch(batch, 'put', ref)).findIndex((reply) => reply !== 1);
    if (missing >= 0) {
      throw new RedisPayloadStoreError(
        'put',
        ref,
        `chunk ${from + missing} expired before the payload was complete: the put took ` +
          'longer than expiresAt + keyTtlMarginMs allows; give it a later expiresAt',
      );
    }
  }
  // Every field, not just the changed ones: should the meta have expired during a long write,
  // the commit recreates it whole. An absent content type or metadata is not stored at all, so
  // head tells absent from empty.
  const fields: Partial<Record<MetaField, string | number>> = {
    state: 'ready',
    bytes,
    chunks,
    createdAt: write.now,
    expiresAt: write.expiresAt,
    published: write.published ? '1' : '0',
    ...(write.contentType !== undefined && { contentType: write.contentType }),
    ...(write.metadata !== undefined && { metadata: JSON.stringify(write.metadata) }),
  };
  await execBatch(redis.multi().hset(keys.meta, fields).pexpire(keys.meta, ttlMs), 'put', ref);

  const listed: Array<readonly [string, number]> = [[write.index.expiry, write.expiresAt]];
  if (!write.published) listed.push([write.index.unpublished, write.now]);
  const indexing = redis.multi();
  for (const [key, score] of listed) {
    // NX gives a new set its first TTL, GT lengthens it: the set outlives what it lists.
    indexing.zadd(key, score, ref).pexpire(key, ttlMs, 'NX').pexpire(key, ttlMs, 'GT');
  }
  await execBatch(indexing, 'put', ref);
}
