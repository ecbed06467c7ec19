import type { Cluster, Redis } from 'ioredis';
import { definedOnly } from '../../../core/objects';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { DIRECT_READS_RENAMED } from '../../stores/redis/redis-direct-reads';
import { checkOptionKeys, type OptionKeysOf } from '../../../core/option-keys';
import { unsafeSocketTricksProblem } from '../../socket-tricks.guard';

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
   * the sweeper never got to (the sweeper was down) still leaves memory. At least the module's
   * `claimCheck.expiredGraceMs`, for handlers still reading an expired payload: the module
   * refuses to start with a shorter margin.
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
   * Reads the chunks of a payload of 1 MiB or more on a connection of the store's own (a
   * `duplicate()` of its client, opened at the first such read, closed when idle) whose socket the
   * store takes over from ioredis and whose replies it parses itself, without copying: half the
   * allocations of reading through ioredis, as `RedisSequenceStore`'s `unsafeSocketTricks` does.
   * Any failure there falls back to the client. Not on Redis Cluster.
   *
   * It relies on ioredis's internals (its client's socket, `stream`), written for ioredis 5.x: on
   * any other version the store logs a warning and leaves it off. Off, the store uses ioredis's
   * public API only.
   * @default false
   */
  readonly unsafeSocketTricks?: boolean;
}

export const REDIS_PAYLOAD_STORE_KEYS = {
  prefix: true,
  chunkBytes: true,
  keyTtlMarginMs: true,
  readAheadChunks: true,
  unsafeSocketTricks: true,
} as const satisfies OptionKeysOf<RedisPayloadStoreOptions>;
export const REDIS_PAYLOAD_STORE_WHERE = 'RedisPayloadStore options';

export type ResolvedRedisPayloadStoreOptions = Required<RedisPayloadStoreOptions>;

export const REDIS_PAYLOAD_STORE_DEFAULTS: ResolvedRedisPayloadStoreOptions = {
  prefix: 'nseq',
  chunkBytes: 1024 * 1024,
  keyTtlMarginMs: 300_000,
  readAheadChunks: 2,
  unsafeSocketTricks: false,
};

/** Redis refuses bulk strings above `proto-max-bulk-len`, 512 MiB by default. */
export const MAX_CHUNK_BYTES = 512 * 1024 * 1024;

/** Fills in defaults; throws `SequenceOptionsError` listing every invalid option. */
export function resolveRedisPayloadStoreOptions(
  options: RedisPayloadStoreOptions = {},
): ResolvedRedisPayloadStoreOptions {
  const resolved = { ...REDIS_PAYLOAD_STORE_DEFAULTS, ...definedOnly(options) };
  const problems: string[] = [];
  checkOptionKeys(problems, options, REDIS_PAYLOAD_STORE_KEYS, DIRECT_READS_RENAMED);
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
  const tricks = unsafeSocketTricksProblem(resolved.unsafeSocketTricks);
  if (tricks) problems.push(tricks);
  if (problems.length > 0) throw new SequenceOptionsError(REDIS_PAYLOAD_STORE_WHERE, problems);
  return resolved;
}

function isPositiveInteger(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 1;
}
