import calculateSlot from 'cluster-key-slot';
import { randomBytes, randomUUID } from 'node:crypto';
import { createServer, type AddressInfo, type Socket } from 'node:net';
import { Readable } from 'node:stream';
import { Redis } from 'ioredis';
import {
  describePayloadStoreConformance,
  digestOf,
  digestOfBuffer,
  generatedSource,
} from '../../../testing/conformance/payload-store.conformance';
import { SERVERS, describeWithServer } from '../../../../test/support/servers';
import { redisClient } from '../../../../test/support/redis.fixture';
import { ClaimCheckNotFoundError } from '../../../core/errors/claim-check-not-found.error';
import { PayloadMetadataCorruptError } from '../../../core/errors/payload-metadata-corrupt.error';
import { InvalidPayloadRefError } from '../../../core/errors/invalid-payload-ref.error';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import type { PayloadStore, PutOptions } from '../../../ports/payload-store.port';
import { RedisPayloadKeys } from './redis-payload-keys';
import { RedisPayloadStoreError } from './redis-payload-store.error';
import { RedisPayloadStore } from './redis.payload-store';
import type { RedisPayloadStoreOptions } from './redis-payload.options';
import {
  directReadsConnections,
  killDirectReadsConnection,
} from '../../../../test/support/direct-reads-connections';

const KiB = 1024;
const MINUTE = 60_000;

/** Every key under `prefix`, on one node. */
async function keysUnder(redis: Redis, prefix: string): Promise<string[]> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
    keys.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  return keys.sort();
}

async function deleteUnder(redis: Redis, prefix: string): Promise<void> {
  const keys = await keysUnder(redis, prefix);
  if (keys.length > 0) await redis.unlink(...keys);
}

const uniquePrefix = () => `nseq-test:${randomUUID()}`;

describeWithServer('redis', 'RedisPayloadStore (Redis at REDIS_URL)', () => {
  let redis: Redis;

  beforeAll(() => {
    redis = redisClient();
  });

  afterAll(async () => {
    await redis.quit();
  });

  describe.each<[string, RedisPayloadStoreOptions]>([
    ['1 MiB chunks (the default)', {}],
    ['odd 64 KiB + 7 byte chunks', { chunkBytes: 64 * KiB + 7 }],
    ['1 MiB chunks and unsafeSocketTricks', { unsafeSocketTricks: true }],
  ])('conformance with %s', (label, options) => {
    const prefixes = new Map<PayloadStore, string>();

    describePayloadStoreConformance(`redis, ${label}`, {
      create: () => {
        const prefix = uniquePrefix();
        const store = new RedisPayloadStore(redis, { ...options, prefix });
        prefixes.set(store, prefix);
        return Promise.resolve(store);
      },
      close: async (store) => {
        await store.close();
        const prefix = prefixes.get(store)!;
        prefixes.delete(store);
        await deleteUnder(redis, prefix);
      },
    });
  });

  describe('Redis specifics', () => {
    const chunkBytes = 64 * KiB;
    let prefix: string;
    let store: RedisPayloadStore;
    let t0: number;

    beforeEach(() => {
      prefix = uniquePrefix();
      store = new RedisPayloadStore(redis, { prefix, chunkBytes, readAheadChunks: 2 });
      t0 = Date.now();
    });

    afterEach(async () => {
      await store.close();
      await deleteUnder(redis, prefix);
    });

    const options = (overrides: Partial<PutOptions> = {}): PutOptions => ({
      now: t0,
      expiresAt: t0 + 30 * MINUTE,
      published: false,
      ...overrides,
    });

    it('stores a payload of several chunks as one key per chunk, none over chunkBytes', async () => {
      const payload = randomBytes(5 * chunkBytes + 123);

      const { ref } = await store.put(Readable.from(payload, { objectMode: false }), options());

      const keys = new RedisPayloadKeys(prefix).payload(ref);
      const chunkKeys = (await keysUnder(redis, prefix)).filter((key) => key.includes(':chunk:'));
      expect(chunkKeys).toHaveLength(6);
      const lengths = await Promise.all(chunkKeys.map((key) => redis.strlen(key)));
      expect(Math.max(...lengths)).toBeLessThanOrEqual(chunkBytes);
      const stored = await Promise.all(
        [0, 1, 2, 3, 4, 5].map(async (index) => (await redis.getBuffer(keys.chunk(index)))!),
      );
      expect(Buffer.concat(stored).equals(payload)).toBe(true);
      expect(await redis.hmget(keys.meta, 'state', 'chunks', 'bytes')).toEqual([
        'ready',
        '6',
        String(payload.length),
      ]);
    });

    it('re-cuts a source of irregular pieces into full chunks', async () => {
      const source = generatedSource(3 * chunkBytes + 1);

      await store.put(source.stream, options());

      const chunkKeys = (await keysUnder(redis, prefix)).filter((key) => key.includes(':chunk:'));
      const lengths = await Promise.all(chunkKeys.map((key) => redis.strlen(key)));
      expect(lengths.sort((a, b) => a - b)).toEqual([1, chunkBytes, chunkBytes, chunkBytes]);
    });

    it('gives every key a TTL of expiresAt - now + keyTtlMarginMs, index keys included', async () => {
      const margin = 300_000;
      const soon = await store.put(
        randomBytes(2 * chunkBytes),
        options({ expiresAt: t0 + 10 * MINUTE }),
      );
      const late = await store.put(Buffer.from('published'), options({ published: true }));
      const names = new RedisPayloadKeys(prefix);
      // The expiry index lists both payloads, so it lives as long as the later one; the
      // unpublished index lists only the first.
      const expected: Record<string, number> = {
        [names.payload(soon.ref).meta]: 10 * MINUTE,
        [names.payload(soon.ref).chunk(0)]: 10 * MINUTE,
        [names.payload(soon.ref).chunk(1)]: 10 * MINUTE,
        [names.payload(late.ref).meta]: 30 * MINUTE,
        [names.payload(late.ref).chunk(0)]: 30 * MINUTE,
        [names.index.unpublished]: 10 * MINUTE,
        [names.index.expiry]: 30 * MINUTE,
      };

      const keys = await keysUnder(redis, prefix);

      expect(keys).toEqual(Object.keys(expected).sort());
      for (const key of keys) {
        const ttl = await redis.pttl(key);
        const wanted = expected[key] + margin;
        expect({ key, ttlAsWanted: ttl > wanted - MINUTE && ttl <= wanted }).toEqual({
          key,
          ttlAsWanted: true,
        });
      }
    });

    it('keeps all keys of one payload in one cluster slot, and payloads in different slots', async () => {
      const slots = new Set<number>();
      for (let index = 0; index < 8; index++) {
        const { ref } = await store.put(randomBytes(2 * chunkBytes + 1), options());
        const keys = new RedisPayloadKeys(prefix).payload(ref);
        const slot = calculateSlot.generateMulti([keys.meta, keys.chunk(0), keys.chunk(2)]);
        expect(slot).toBeGreaterThanOrEqual(0);
        slots.add(slot);
      }
      const index = new RedisPayloadKeys(prefix).index;

      expect(slots.size).toBeGreaterThan(1);
      expect(calculateSlot.generateMulti([index.expiry, index.unpublished])).toBeGreaterThanOrEqual(
        0,
      );
    });

    it('leaves no key at all after a source fails several chunks in', async () => {
      const cause = new Error('upload aborted');
      const source = generatedSource(10 * chunkBytes, {
        failAfter: 4 * chunkBytes,
        failWith: cause,
      });

      await expect(store.put(source.stream, options())).rejects.toBe(cause);

      expect(await keysUnder(redis, prefix)).toEqual([]);
    });

    it('rejects and leaves no key when chunks expire before the put completes', async () => {
      const expiring = new RedisPayloadStore(redis, { prefix, chunkBytes: 4, keyTtlMarginMs: 1 });
      async function* slowly(): AsyncGenerator<Buffer> {
        for (let index = 0; index < 3; index++) {
          yield Buffer.from('1234');
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
      }

      const put = expiring.put(Readable.from(slowly()), options({ expiresAt: t0 - MINUTE }));

      await expect(put).rejects.toBeInstanceOf(RedisPayloadStoreError);
      expect(await keysUnder(redis, prefix)).toEqual([]);
    });

    it('errors the stream with ClaimCheckNotFoundError when the payload is deleted mid-read', async () => {
      const payload = randomBytes(10 * chunkBytes);
      const { ref } = await store.put(payload, options());
      const stream = await store.get(ref);
      const iterator = stream[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
      const first = await iterator.next();
      expect(first.done).toBe(false);

      await store.delete(ref);

      const error = await (async () => {
        for (let read = 1; read <= 10; read++) {
          const { done } = await iterator.next();
          if (done) return new Error('the stream ended cleanly');
        }
        return new Error('the stream gave every chunk');
      })().catch((caught: unknown) => caught);
      expect(error).toBeInstanceOf(ClaimCheckNotFoundError);
      expect(error).toMatchObject({ store: 'redis', ref });
    });

    it('errors the stream when one chunk expired under it', async () => {
      const { ref } = await store.put(randomBytes(4 * chunkBytes), options());
      await redis.unlink(new RedisPayloadKeys(prefix).payload(ref).chunk(2));

      await expect(digestOf(await store.get(ref))).rejects.toBeInstanceOf(ClaimCheckNotFoundError);
    });

    it('answers metadata it cannot read with PayloadMetadataCorruptError, not a SyntaxError', async () => {
      const { ref } = await store.put(randomBytes(10), options({ metadata: { study: 'ct' } }));
      const meta = new RedisPayloadKeys(prefix).payload(ref).meta;

      await redis.hset(meta, 'metadata', '{"study":');
      await expect(store.head(ref)).rejects.toBeInstanceOf(PayloadMetadataCorruptError);
      await redis.hset(meta, 'metadata', '["ct"]');
      await expect(store.head(ref)).rejects.toThrow(/not metadata: an object of strings/);
    });

    it('reads chunks through the client when its own connection is refused them (unsafeSocketTricks)', async () => {
      // A user that may GET but not GETRANGE: every direct read is refused (NOPERM).
      const user = `nseq-test-${randomUUID()}`;
      await redis.call('ACL', 'SETUSER', user, 'on', '>secret', '~*', '+@all', '-getrange');
      const limited = redisClient({ username: user, password: 'secret' });
      try {
        await limited.ping();
        const reader = new RedisPayloadStore(limited, {
          prefix,
          chunkBytes,
          readAheadChunks: 2,
          unsafeSocketTricks: true,
        });
        const payload = randomBytes(20 * chunkBytes + 3); // over 1 MiB: read directly
        const { ref } = await store.put(payload, options());
        expect(await digestOf(await reader.get(ref))).toEqual(digestOfBuffer(payload));
        await reader.close();
      } finally {
        limited.disconnect();
        await redis.call('ACL', 'DELUSER', user);
      }
    });

    it('reads chunks on a connection of its own, byte-exact when that one is killed midway (unsafeSocketTricks)', async () => {
      const name = `nseq-test-${randomUUID()}`;
      const named = redisClient({ connectionName: name });
      try {
        await named.ping();
        const reader = new RedisPayloadStore(named, {
          prefix,
          chunkBytes,
          readAheadChunks: 2,
          unsafeSocketTricks: true,
        });
        const listed = async () => (await directReadsConnections(redis, name)).length > 0;
        // Under 1 MiB: through the client, no connection of its own.
        const small = randomBytes(3 * chunkBytes);
        const { ref: smallRef } = await store.put(small, options());
        expect(await digestOf(await reader.get(smallRef))).toEqual(digestOfBuffer(small));
        expect(await listed()).toBe(false);
        const payload = randomBytes(20 * chunkBytes + 3); // over 1 MiB: read directly
        const { ref } = await store.put(payload, options());
        const received: Buffer[] = [];
        let killed = 0;
        for await (const part of await reader.get(ref)) {
          received.push(part as Buffer);
          if (received.length === 1) {
            killed = await killDirectReadsConnection(redis, name);
          }
        }
        expect(killed).toBe(1);
        expect(Buffer.concat(received).equals(payload)).toBe(true);
        await reader.close();
      } finally {
        await named.quit();
      }
    });

    it('reads a payload in order from a fresh store with other options (chunk count is stored)', async () => {
      const payload = randomBytes(3 * chunkBytes + 5);
      const { ref } = await store.put(payload, options());
      const other = new RedisPayloadStore(redis, { prefix, chunkBytes: 7, readAheadChunks: 1 });

      expect(await digestOf(await other.get(ref))).toEqual(digestOfBuffer(payload));
    });

    it.each([
      ['a hash tag', '{payload:x}'],
      ['a closing brace', `${randomUUID()}}`],
      ['a colon and a chunk suffix', `${randomUUID()}:chunk:0`],
      ['a pattern', '*'],
      ['a space', `${randomUUID()} `],
      ['a newline', `${randomUUID()}\n`],
      ['an uppercase UUID', randomUUID().toUpperCase()],
      ['a non-string', 42 as unknown as string],
    ])('refuses a ref with %s before sending any command', async (_label, ref) => {
      // A client that is never connected and queues nothing: any command would reject otherwise.
      const offline = redisClient({
        lazyConnect: true,
        enableOfflineQueue: false,
      });
      const guarded = new RedisPayloadStore(offline, { prefix });
      try {
        for (const attempt of [
          () => guarded.get(ref),
          () => guarded.head(ref),
          () => guarded.delete(ref),
          () => guarded.markPublished(ref),
        ]) {
          await expect(attempt()).rejects.toBeInstanceOf(InvalidPayloadRefError);
        }
        expect(offline.status).toBe('wait');
      } finally {
        offline.disconnect();
      }
    });

    it('leaves no stray key when markPublished races a delete', async () => {
      const { ref } = await store.put(Buffer.from('x'), options());
      await store.delete(ref);

      expect(await store.markPublished(ref)).toBe(false);

      expect(await keysUnder(redis, prefix)).toEqual([]);
    });

    it('removes the payload from both sweep indexes when deleted', async () => {
      const { ref } = await store.put(randomBytes(100), options());
      const index = new RedisPayloadKeys(prefix).index;
      expect(await redis.zscore(index.unpublished, ref)).toBe(String(t0));

      await store.delete(ref);

      expect(await redis.zscore(index.expiry, ref)).toBeNull();
      expect(await redis.zscore(index.unpublished, ref)).toBeNull();
    });

    it('unindexes an orphan whose meta is gone, so that sweeps stop listing it', async () => {
      const { ref } = await store.put(randomBytes(100), options());
      // Its meta expired or was lost while its index entries, on their longer TTL, stayed.
      await redis.unlink(new RedisPayloadKeys(prefix).payload(ref).meta);
      const orphans = { now: t0, unpublishedBefore: t0, limit: 10 };
      expect(await store.sweepCandidates(orphans)).toEqual([{ ref, reason: 'orphaned' }]);

      expect(await store.deleteUnpublished(ref)).toBe(false);

      expect(await store.sweepCandidates(orphans)).toEqual([]);
      expect(await store.sweepCandidates({ ...orphans, now: t0 + 60 * MINUTE })).toEqual([]);
    });

    it('sends its delete of an orphan as EVALSHA once the server knows the script', async () => {
      const own = redisClient();
      const sent: string[] = [];
      const send = own.sendCommand.bind(own);
      const spy = jest.spyOn(own, 'sendCommand').mockImplementation((command, stream) => {
        sent.push(command.name.toLowerCase());
        return send(command, stream);
      });
      try {
        const orphans = new RedisPayloadStore(own, { prefix });
        const [first, second] = [
          await orphans.put(Buffer.from('a'), options()),
          await orphans.put(Buffer.from('b'), options()),
        ];
        expect(await orphans.deleteUnpublished(first.ref)).toBe(true);
        sent.length = 0;

        expect(await orphans.deleteUnpublished(second.ref)).toBe(true);

        expect(sent.filter((name) => name.startsWith('eval'))).toEqual(['evalsha']);
      } finally {
        spy.mockRestore();
        await own.quit();
      }
    });

    it('closes only a client it created', async () => {
      const owned = RedisPayloadStore.connect(SERVERS.redis.url, { prefix });
      await owned.ping();

      await owned.close();
      await store.close();

      await expect(owned.ping()).rejects.toThrow();
      await expect(redis.ping()).resolves.toBe('PONG');
    });
  });

  describe('options', () => {
    it.each([
      ['a prefix with braces', { prefix: 'app{1}' }, /prefix/],
      ['chunkBytes of 0', { chunkBytes: 0 }, /chunkBytes/],
      ['chunkBytes over 512 MiB', { chunkBytes: 512 * 1024 * 1024 + 1 }, /chunkBytes/],
      ['a fractional keyTtlMarginMs', { keyTtlMarginMs: 1.5 }, /keyTtlMarginMs/],
      ['readAheadChunks of 0', { readAheadChunks: 0 }, /readAheadChunks/],
      [
        'unsafeSocketTricks that is not a boolean',
        { unsafeSocketTricks: 'yes' as never },
        /unsafeSocketTricks must be true or false/,
      ],
      [
        'directReads, which unsafeSocketTricks replaced',
        { directReads: true } as RedisPayloadStoreOptions,
        /directReads is no longer an option: use unsafeSocketTricks: true/,
      ],
    ])('refuses %s with SequenceOptionsError', (_label, options, message) => {
      const build = () => new RedisPayloadStore(redis, options);

      expect(build).toThrow(SequenceOptionsError);
      expect(build).toThrow(message);
    });
  });
});

describe('RedisPayloadStore on a Redis that accepts connections and never answers', () => {
  it("stops waiting for a get's metadata once its signal aborts, with the signal's reason", async () => {
    const sockets = new Set<Socket>();
    const silent = createServer((socket) => {
      sockets.add(socket);
      socket.resume();
    });
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const { port } = silent.address() as AddressInfo;
    const redis = new Redis({ port, host: '127.0.0.1', retryStrategy: () => null });
    redis.on('error', () => undefined);
    const store = new RedisPayloadStore(redis);
    try {
      const controller = new AbortController();
      const outcome = store.get(randomUUID(), { signal: controller.signal }).then(
        () => 'resolved',
        (error: Error) => error.message,
      );
      await new Promise((resolve) => setTimeout(resolve, 100));

      controller.abort(new Error('the handler is over'));

      await expect(
        Promise.race([outcome, new Promise((r) => setTimeout(() => r('still waiting'), 2_000))]),
      ).resolves.toBe('the handler is over');
    } finally {
      redis.disconnect();
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => silent.close(resolve));
    }
  });
});
