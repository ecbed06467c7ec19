import type { ChainableCommander } from 'ioredis';
import type { PayloadIndexKeys, PayloadKeys } from './redis-payload-keys';
import type { RedisPayloadClient } from './redis-payload.options';
import { RedisPayloadStoreError } from './redis-payload-store.error';

/** Keys per UNLINK or PEXPIRE batch: bounded commands, bounded pipelines. */
export const KEY_BATCH = 1_000;

/** Runs a MULTI or pipeline; rejects with the first command error, else resolves the replies. */
export async function execBatch(
  batch: ChainableCommander,
  operation: string,
  ref: string,
): Promise<unknown[]> {
  const results = await batch.exec();
  if (!results) throw new RedisPayloadStoreError(operation, ref, 'the transaction was aborted');
  return results.map(([error, reply]) => {
    if (error) throw error;
    return reply;
  });
}

/** Unlinks a payload's meta, then its chunks; true when the meta was there. */
export async function unlinkPayload(
  redis: RedisPayloadClient,
  keys: PayloadKeys,
  chunks: number,
): Promise<boolean> {
  // Meta first: from then on get and head see nothing, and a read in progress fails at its
  // next chunk instead of streaming a payload that is half gone.
  const removed = (await redis.unlink(keys.meta)) > 0;
  for (let from = 0; from < chunks; from += KEY_BATCH) {
    const batch: string[] = [];
    for (let index = from; index < Math.min(chunks, from + KEY_BATCH); index++) {
      batch.push(keys.chunk(index));
    }
    await redis.unlink(...batch);
  }
  return removed;
}

/** Takes a ref out of both sweep indexes (one slot, one MULTI). */
export async function unindexPayload(
  redis: RedisPayloadClient,
  index: PayloadIndexKeys,
  ref: string,
): Promise<void> {
  await execBatch(
    redis.multi().zrem(index.expiry, ref).zrem(index.unpublished, ref),
    'delete',
    ref,
  );
}
