import type { Cluster, Redis } from 'ioredis';
import { definedOnly } from '../../../core/objects';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

/** A single-node client or a Cluster client: every command the store sends stays in one slot. */
export type RedisPayloadClient = Redis | Cluster;

export interface RedisPayloadStoreOptions {
  /**
   * Prepended to every key; without `{` or `}` (they would break the hash tags).
   * @default 'nseq'
   */
  readonly prefix?: string;
  /**
   * Size of each chunk key. A payload of N bytes takes ceil(N / chunkBytes) string keys, so no
   * Redis value is ever larger than this, and `put` and `get` hold about two chunks at a time.
   * At most 512 MiB (Redis's largest string).
   * @default 1_048_576 (1 MiB)
   */
  readonly chunkBytes?: number;
  /**
   * How much longer than the payload's `expiresAt` its keys live in Redis, so that a payload
   * the sweeper never got to (the sweeper was down) still leaves memory.
   * @default 300_000
   */
  readonly keyTtlMarginMs?: number;
  /**
   * Chunks `get` fetches ahead of the stream (at least 1): a read holds at most this many plus
   * two (the one in the stream's buffer, the one its consumer is handling).
   * @default 2
   */
  readonly readAheadChunks?: number;
  /**
   * Whether the chunks of a payload of 1 MiB or more are read on a connection of the store's
   * own, whose replies are parsed without copying (as `RedisSequenceStore`'s `directReads`): half
   * the allocations of reading through ioredis. Any failure there falls back to the client.
   * Ignored on Redis Cluster.
   * @default true
   */
  readonly directReads?: boolean;
}

export type ResolvedRedisPayloadStoreOptions = Required<RedisPayloadStoreOptions>;

export const REDIS_PAYLOAD_STORE_DEFAULTS: ResolvedRedisPayloadStoreOptions = {
  prefix: 'nseq',
  chunkBytes: 1024 * 1024,
  keyTtlMarginMs: 300_000,
  readAheadChunks: 2,
  directReads: true,
};

/** Redis refuses bulk strings above `proto-max-bulk-len`, 512 MiB by default. */
export const MAX_CHUNK_BYTES = 512 * 1024 * 1024;

/** Fills in defaults; throws `SequenceOptionsError` listing every invalid option. */
export function resolveRedisPayloadStoreOptions(
  options: RedisPayloadStoreOptions = {},
): ResolvedRedisPayloadStoreOptions {
  const resolved = { ...REDIS_PAYLOAD_STORE_DEFAULTS, ...definedOnly(options) };
  const problems: string[] = [];
  if (typeof resolved.prefix !== 'string' || /[{}]/.test(resolved.prefix)) {
    problems.push(
      `prefix must be a string without { or } (they would break the hash tag that keeps each ` +
        `payload in one cluster slot), got ${JSON.stringify(resolved.prefix)}`,
    );
  }
  if (!isPositiveInteger(resolved.chunkBytes) || resolved.chunkBytes > MAX_CHUNK_BYTES) {
    problems.push(
      `chunkBytes must be an integer from 1 to ${MAX_CHUNK_BYTES} (512 MiB), got ${String(resolved.chunkBytes)}`,
    );
  }
  if (!isPositiveInteger(resolved.keyTtlMarginMs)) {
    problems.push(
      `keyTtlMarginMs must be a positive integer of milliseconds, got ${String(resolved.keyTtlMarginMs)}`,
    );
  }
  if (!isPositiveInteger(resolved.readAheadChunks)) {
    problems.push(
      `readAheadChunks must be a positive integer, got ${String(resolved.readAheadChunks)}`,
    );
  }
  if (typeof resolved.directReads !== 'boolean') {
    problems.push(`directReads must be true or false, got ${String(resolved.directReads)}`);
  }
  if (problems.length > 0) throw new SequenceOptionsError('RedisPayloadStore options', problems);
  return resolved;
}

function isPositiveInteger(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 1;
}
