/*
 * The Redis payload store: Claim Check payloads cut into chunk keys, so that a 1 GB payload never
 * needs a 1 GB string (Redis caps strings at 512 MiB, and a huge value blocks the server while it
 * is copied).
 *
 * Keys (see redis-payload-keys.ts): per payload a meta hash and chunk strings sharing the hash tag
 * `{payload:<ref>}`; two store-wide sorted sets in `{payload-idx}` for the sweeper. Every command
 * batch (MULTI, pipeline or script) touches one slot only, so the store runs unchanged on Redis
 * Cluster. One small script decides the sweeper's delete of an orphan (`deleteUnpublished`).
 *
 * put: the meta is written first with state=writing (get and head treat it as absent), the
 * chunks follow one by one (one in flight while the next is cut), then the meta is committed to
 * state=ready in one MULTI (HSET of every field + PEXPIRE), and only then is the ref added to the
 * indexes. Nobody but the writer knows the ref before put resolves, so nothing (no sweeper, no
 * delete) can race the writing; a writer that dies leaves keys that are not indexed but carry a
 * TTL. Before the commit, the chunks' TTLs are reset to the meta's, which also proves they all
 * still exist (a PEXPIRE on a missing key answers 0).
 *
 * TTLs: every key lives until `expiresAt + keyTtlMarginMs`, computed from `now` as a duration (a
 * safety net in real time; the sweeper works on the `now` it is given). The index sets get the
 * longest TTL of the payloads they list (PEXPIRE NX, then GT), so a sweeper that never runs
 * leaks nothing either.
 */
import type { RedisOptions } from 'ioredis';
import { isCluster, connectOwned, quitRedisClient } from '../../stores/redis/redis-client';
import { loadScripts } from '../../stores/redis/redis-scripts';
import {
  DIRECT_READS_MIN_BYTES,
  DIRECT_READS_RENAMED,
  RedisDirectReads,
} from '../../stores/redis/redis-direct-reads';
import { socketTricksEnabled } from '../../socket-tricks.guard';
import { randomUUID } from 'node:crypto';
import type { Readable } from 'node:stream';
import { ClaimCheckNotFoundError } from '../../../core/errors/claim-check-not-found.error';
import { InvalidPayloadRefError } from '../../../core/errors/invalid-payload-ref.error';
import { unlessAborted } from '../../../core/async';
import type {
  GetOptions,
  PayloadInfo,
  PayloadStore,
  PutOptions,
  StoredPayload,
  SweepCandidate,
  SweepQuery,
} from '../../../ports/payload-store.port';
import { execBatch, unindexPayload, unlinkPayload } from './redis-payload.commands';
import {
  isStoreRef,
  RedisPayloadKeys,
  type MetaField,
  type PayloadKeys,
} from './redis-payload-keys';
import {
  REDIS_PAYLOAD_STORE_KEYS,
  REDIS_PAYLOAD_STORE_WHERE,
  resolveRedisPayloadStoreOptions,
  type RedisPayloadClient,
  type RedisPayloadStoreOptions,
  type ResolvedRedisPayloadStoreOptions,
} from './redis-payload.options';
import { decodeUserMetadata } from '../stored-metadata';
import { RedisChunkReader } from './redis-chunk.reader';
import { writePayload } from './redis-payload.writer';
import { checkPutOptions } from '../put-options';
import { putFromSource } from '../put-source';

/**
 * TTL given to a meta hash that markPublished may have recreated for a payload deleted
 * meanwhile; it is deleted right after, the TTL covers a crash in between.
 */
const STRAY_META_TTL_MS = 60_000;

/**
 * {@link PayloadStore} on Redis (single node or Cluster). See the top of this file for the
 * protocol.
 *
 * @example
 * const payloads = new RedisPayloadStore(new Redis(process.env.REDIS_URL), { prefix: 'imaging' });
 */
export class RedisPayloadStore implements PayloadStore {
  readonly name = 'redis';

  private readonly options: ResolvedRedisPayloadStoreOptions;
  private readonly keys: RedisPayloadKeys;
  private readonly directReads?: RedisDirectReads;
  private ownsClient = false;

  constructor(
    private readonly redis: RedisPayloadClient,
    options: RedisPayloadStoreOptions = {},
  ) {
    this.options = resolveRedisPayloadStoreOptions(options);
    this.keys = new RedisPayloadKeys(this.options.prefix);
    const tricks = socketTricksEnabled(
      this.options.unsafeSocketTricks,
      'ioredis',
      'RedisPayloadStore',
    );
    if (tricks && !isCluster(redis)) {
      this.directReads = new RedisDirectReads(redis, undefined, 'RedisPayloadStore');
    }
  }

  /** `keyTtlMarginMs`: every key of a payload expires that long after the payload's `expiresAt`. */
  get expiredRetentionMs(): number {
    return this.options.keyTtlMarginMs;
  }

  /** A store with a client of its own, which `close()` quits. */
  static connect(
    url: string,
    options: RedisPayloadStoreOptions & { readonly redis?: RedisOptions } = {},
  ): RedisPayloadStore {
    return connectOwned(
      url,
      options,
      REDIS_PAYLOAD_STORE_WHERE,
      REDIS_PAYLOAD_STORE_KEYS,
      (client, storeOptions) => {
        const store = new RedisPayloadStore(client, storeOptions);
        store.ownsClient = true;
        return store;
      },
      DIRECT_READS_RENAMED,
    );
  }

  put(payload: Buffer | Readable, options: PutOptions): Promise<StoredPayload> {
    return putFromSource(payload, async () => {
      checkPutOptions(this.name, options);
      const ref = randomUUID();
      const bytes = await writePayload(this.redis, payload, {
        ...options,
        ref,
        keys: this.keys.payload(ref),
        index: this.keys.index,
        chunkBytes: this.options.chunkBytes,
        ttlMs: this.ttlOf(options),
      });
      return { ref, bytes };
    });
  }

  /** The payload's chunks as a stream; its metadata read first, until `signal` aborts. */
  async get(ref: string, { signal }: GetOptions = {}): Promise<Readable> {
    const keys = this.keysOf(ref);
    const [state, chunks, bytes] = await unlessAborted(
      this.redis.hmget(keys.meta, 'state', 'chunks', 'bytes'),
      signal,
    );
    if (state !== 'ready') throw new ClaimCheckNotFoundError(this.name, ref);
    const direct = Number(bytes) >= DIRECT_READS_MIN_BYTES;
    return new RedisChunkReader(
      Number(chunks),
      (index) => this.readChunk(keys.chunk(index), direct),
      this.options.readAheadChunks,
      () => new ClaimCheckNotFoundError(this.name, ref),
    );
  }

  async head(ref: string): Promise<PayloadInfo | undefined> {
    const meta = (await this.redis.hgetall(this.keysOf(ref).meta)) as Partial<
      Record<MetaField, string>
    >;
    if (meta.state !== 'ready') return undefined;
    return {
      ref,
      bytes: Number(meta.bytes),
      createdAt: Number(meta.createdAt),
      expiresAt: Number(meta.expiresAt),
      published: meta.published === '1',
      ...(meta.contentType !== undefined && { contentType: meta.contentType }),
      ...(meta.metadata !== undefined && {
        metadata: decodeUserMetadata(this.name, ref, meta.metadata),
      }),
    };
  }

  async delete(ref: string): Promise<boolean> {
    const keys = this.keysOf(ref);
    const chunks = Number((await this.redis.hget(keys.meta, 'chunks')) ?? 0);
    const removed = await unlinkPayload(this.redis, keys, chunks);
    await unindexPayload(this.redis, this.keys.index, ref);
    return removed;
  }

  /**
   * One script on the meta hash (one key, so one slot; lua/payload-delete-unpublished-1.lua)
   * removes it only while the payload is ready and unpublished: `markPublished` sets `published`
   * in one MULTI, so either it finds the meta gone (and answers false) or the script finds the
   * payload published. The chunks and index entries follow, as in `delete`; a ref indexed
   * without a payload (its meta expired or lost) is unindexed too, or it would be listed by every
   * sweep until its index entry expired.
   */
  async deleteUnpublished(ref: string): Promise<boolean> {
    const keys = this.keysOf(ref);
    const chunks = (await loadScripts(this.redis)['payload-delete-unpublished'](
      [keys.meta],
      [],
    )) as number | null;
    if (chunks === null) return false;
    if (chunks >= 0) await unlinkPayload(this.redis, keys, chunks);
    await unindexPayload(this.redis, this.keys.index, ref);
    return chunks >= 0;
  }

  async markPublished(ref: string): Promise<boolean> {
    const keys = this.keysOf(ref);
    // Index first: should the next step fail, the payload is at worst kept until it expires,
    // never swept as an orphan although its ticket is out.
    await this.redis.zrem(this.keys.index.unpublished, ref);
    // HSET alone would create a meta for a payload deleted meanwhile: the same MULTI reads the
    // state (absent = there was nothing) and gives such a stray hash a TTL, never a live one.
    const replies = await execBatch(
      this.redis
        .multi()
        .hget(keys.meta, 'state')
        .hset(keys.meta, 'published', '1')
        .pexpire(keys.meta, STRAY_META_TTL_MS, 'NX'),
      'markPublished',
      ref,
    );
    const state = replies[0] as string | null;
    if (state === null) await this.redis.unlink(keys.meta);
    return state === 'ready';
  }

  async sweepCandidates(query: SweepQuery): Promise<SweepCandidate[]> {
    if (query.limit <= 0) return [];
    const { expiry, unpublished } = this.keys.index;
    const [expired, orphaned] = await Promise.all([
      this.redis.zrangebyscore(expiry, '-inf', query.now, 'WITHSCORES', 'LIMIT', 0, query.limit),
      this.redis.zrangebyscore(
        unpublished,
        '-inf',
        query.unpublishedBefore,
        'WITHSCORES',
        'LIMIT',
        0,
        query.limit,
      ),
    ]);
    const found = new Map<string, SweepCandidate & { readonly since: number }>();
    for (const [reason, list] of [
      ['expired', expired],
      ['orphaned', orphaned],
    ] as const) {
      for (let at = 0; at < list.length; at += 2) {
        const ref = list[at];
        if (!found.has(ref)) found.set(ref, { ref, reason, since: Number(list[at + 1]) });
      }
    }
    // Oldest first: by the instant each became a candidate's reason (expiry or creation).
    return [...found.values()]
      .sort((a, b) => a.since - b.since)
      .slice(0, query.limit)
      .map(({ ref, reason }) => ({ ref, reason }));
  }

  async ping(): Promise<void> {
    await this.redis.ping();
  }

  /**
   * Closes the store's own connection for reads, and quits the client when `connect` created it;
   * a client passed in stays the caller's.
   */
  async close(): Promise<void> {
    await this.directReads?.close();
    if (!this.ownsClient) return;
    await quitRedisClient(this.redis);
  }

  /**
   * A chunk: without copying when it can, else (and whenever the direct read fails or finds
   * nothing) through the client, whose answer stands. Chunks are never empty, so no bytes from
   * GETRANGE mean a missing key, which the client's GET confirms with null.
   */
  private async readChunk(
    key: string,
    direct: boolean,
  ): Promise<Buffer | readonly Buffer[] | null> {
    const parts = direct
      ? await this.directReads?.getRangeOrNothing(key, 0, -1, (bytes) => bytes > 0)
      : undefined;
    return parts ?? this.redis.getBuffer(key);
  }

  /** The payload's keys; a ref the store could not have generated never reaches a key name. */
  private keysOf(ref: string): PayloadKeys {
    if (!isStoreRef(ref)) {
      throw new InvalidPayloadRefError(
        this.name,
        String(ref).slice(0, 200),
        'refs of this store are lowercase UUIDs it generated; this one came from elsewhere',
      );
    }
    return this.keys.payload(ref);
  }

  /** Redis TTL of every key of a payload: until `expiresAt` plus the margin, at least 1 ms. */
  private ttlOf(options: PutOptions): number {
    if (!Number.isFinite(options.now) || !Number.isFinite(options.expiresAt)) {
      throw new RangeError(
        `put needs finite now and expiresAt (epoch ms), got now=${options.now} and ` +
          `expiresAt=${options.expiresAt}`,
      );
    }
    return Math.ceil(Math.max(0, options.expiresAt - options.now) + this.options.keyTtlMarginMs);
  }
}
