import calculateSlot from 'cluster-key-slot';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import {
  readAll,
  sequenceFixture,
  storedChargeOf,
  describeSequenceStoreConformance,
} from '../../../testing/conformance/sequence-store.conformance';
import { OwnedRedisServer } from '../../../../test/support/processes/owned-redis.server';
import { exposedGc } from '../../../../test/support/garbage';
import { SERVERS, describeWithServer } from '../../../../test/support/servers';
import { deleteUnder, keysUnder, redisClient } from '../../../../test/support/redis.fixture';
import { crc32 } from '../../../core/checksum';
import { FRAGMENT_OVERHEAD_BYTES } from '../../../core/completeness';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { StoredFragmentIntegrityError } from '../../../core/errors/stored-fragment-integrity.error';
import type { AcceptContext, SequenceStore } from '../../../ports/sequence-store.port';
import { NO_GRANT, RedisBudget } from './redis-budget';
import { RedisKeys, sequenceKeyList } from './redis-keys';
import { loadScripts } from './redis-scripts';
import { acceptArguments, interpretAccept } from './redis-script-codec';
import { RedisSequenceStore } from './redis.sequence-store';
import { RedisDirectReads } from './redis-direct-reads';
import {
  directReadsConnections,
  killDirectReadsConnection,
} from '../../../../test/support/direct-reads-connections';

const MiB = 1024 * 1024;

/** PTTL and PEXPIRE calls so far, from INFO commandstats (scripts' calls included). */
function ttlCalls(info: string): number {
  let calls = 0;
  for (const name of ['pttl', 'pexpire']) {
    const match = new RegExp(`cmdstat_${name}:calls=(\\d+)`).exec(info);
    calls += match ? Number(match[1]) : 0;
  }
  return calls;
}

const isGlobal = (key: string) => key.includes(':{idx}:');

describeWithServer('redis', 'RedisSequenceStore (Redis at REDIS_URL)', () => {
  let redis: Redis;

  beforeAll(() => {
    redis = redisClient();
  });

  afterAll(async () => {
    await redis.quit();
  });

  describe('conformance', () => {
    const prefixes = new Map<SequenceStore, string>();

    const encryption = { keys: [{ id: 'conformance', key: randomBytes(32) }] };
    for (const [name, unsafeSocketTricks, encrypted] of [
      ['redis', false, false],
      ['redis (unsafeSocketTricks)', true, false],
      ['redis (encrypted)', false, true],
      ['redis (encrypted, unsafeSocketTricks)', true, true],
    ] as const) {
      describeSequenceStoreConformance(name, {
        create: async () => {
          const prefix = `nseq-test:${randomUUID()}`;
          const store = new RedisSequenceStore(redis, {
            prefix,
            unsafeSocketTricks,
            ...(encrypted && { encryption }),
          });
          prefixes.set(store, prefix);
          return store;
        },
        close: async (store) => {
          await store.close();
          const prefix = prefixes.get(store)!;
          prefixes.delete(store);
          await deleteUnder(redis, prefix);
          expect(await keysUnder(redis, prefix)).toEqual([]);
        },
      });
    }
  });

  describe('RedisSequenceStore', () => {
    let prefix: string;
    let store: RedisSequenceStore;
    let scope: string;
    let t0: number;

    beforeEach(() => {
      prefix = `nseq-test:${randomUUID()}`;
      store = new RedisSequenceStore(redis, { prefix });
      scope = `spec.${randomUUID()}`;
      t0 = Date.now();
    });

    afterEach(async () => {
      await store.close();
      await deleteUnder(redis, prefix);
      expect(await keysUnder(redis, prefix)).toEqual([]);
    });

    function context(now: number, overrides: Partial<AcceptContext> = {}): AcceptContext {
      return {
        now,
        consumerId: 'consumer-a',
        leaseMs: 30_000,
        expiry: { ms: 60_000, strategy: 'fixed' },
        retentionMs: 3_600_000,
        limits: {
          maxSequenceBytes: 128 * MiB,
          maxFragments: 1_000,
          maxBufferedBytes: 256 * MiB,
          maxOpenSequences: 1_000,
        },
        ...overrides,
      };
    }

    async function ttlsUnder(): Promise<Record<string, number>> {
      const ttls: Record<string, number> = {};
      for (const key of await keysUnder(redis, prefix)) ttls[key] = await redis.pttl(key);
      return ttls;
    }

    const sequenceKeysUnder = async () =>
      (await keysUnder(redis, prefix)).filter((key) => !isGlobal(key)).sort();

    /**
     * The sequence's keys but an expiry's report, which an expire keeps a minute for a resend of
     * its own (and no longer: checked here).
     */
    const lastingKeys = async () => {
      const keys = await sequenceKeysUnder();
      for (const key of keys.filter((each) => each.endsWith(':expire-report'))) {
        expect(await redis.pttl(key)).toBeLessThanOrEqual(60_000);
      }
      return keys.filter((key) => !key.endsWith(':expire-report'));
    };

    it('says the fragment that completed a sequence was stored, and a copy taking it over was not', async () => {
      const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
      await store.accept(fragments[0], context(t0));

      expect(await store.accept(fragments[1], context(t0))).toMatchObject({
        status: 'complete',
        opened: false,
        stored: true,
      });
      await store.releaseLease(ref, 'consumer-a', t0 + 1);
      const copy = { ...fragments[1], body: Buffer.from('B') };
      expect(await store.accept(copy, context(t0 + 1, { consumerId: 'consumer-b' }))).toMatchObject(
        { status: 'complete', opened: false, stored: false },
      );
      expect(Buffer.concat(await readAll(store.read(ref))).toString()).toBe('ab');
    });

    it('is named redis and answers ping', async () => {
      expect(store.name).toBe('redis');
      await expect(store.ping()).resolves.toBeUndefined();
    });

    it.each([
      [{ readAhead: Number.NaN }, /readAhead must be an integer >= 1, got NaN/],
      [{ readAhead: 0 }, /readAhead must be an integer >= 1, got 0/],
      [{ readAheadFragments: 1.5 }, /readAhead must be an integer >= 1, got 1.5/],
      [{ readPieceBytes: Number.NaN }, /readPieceBytes must be an integer >= 65536, got NaN/],
      [{ readPieceBytes: 1024 }, /readPieceBytes must be an integer >= 65536, got 1024/],
      [{ readVerification: 'md5' as 'crc32' }, /readVerification must be 'crc32' or 'sha256'/],
    ])('refuses read options that would make reads wrong or stall: %p', (options, message) => {
      expect(() => new RedisSequenceStore(redis, { prefix, ...options })).toThrow(
        SequenceOptionsError,
      );
      expect(() => new RedisSequenceStore(redis, { prefix, ...options })).toThrow(message);
    });

    it.each([
      [{ unsafeSocketTricks: 'yes' as never }, /unsafeSocketTricks must be true or false/],
      [
        { directReads: false } as never,
        /directReads is no longer an option: use unsafeSocketTricks: true/,
      ],
    ])('refuses %p, naming what to pass instead', (options, message) => {
      expect(() => new RedisSequenceStore(redis, { prefix, ...options })).toThrow(
        SequenceOptionsError,
      );
      expect(() => new RedisSequenceStore(redis, { prefix, ...options })).toThrow(message);
    });

    it('takes readAheadFragments, its former name, for readAhead', async () => {
      const legacy = new RedisSequenceStore(redis, { prefix, readAheadFragments: 1 });
      const { fragments, ref } = sequenceFixture(scope, ['a', 'b', 'c']);
      for (const fragment of fragments) await legacy.accept(fragment, context(t0));
      expect(Buffer.concat(await readAll(legacy.read(ref))).toString()).toBe('abc');
      expect(legacy.verifiesReads).toBe(true);
      expect(
        new RedisSequenceStore(redis, { prefix, readVerification: 'sha256' }).verifiesReads,
      ).toBe(false);
    });

    it('refuses a prefix with braces, which would break the hash tags', () => {
      expect(() => new RedisSequenceStore(redis, { prefix: 'app{1}' })).toThrow(/braces/);
    });

    it('refuses a keyTtlMarginMs that is not a positive integer of milliseconds', () => {
      for (const keyTtlMarginMs of [0, -1, 1.5]) {
        expect(() => new RedisSequenceStore(redis, { prefix, keyTtlMarginMs })).toThrow(
          SequenceOptionsError,
        );
      }
      expect(() => new RedisSequenceStore(redis, { prefix, keyTtlMarginMs: 1 })).not.toThrow();
    });

    it('sets a TTL on every key it writes', async () => {
      const { fragments } = sequenceFixture(scope, ['a', 'b', 'c']);
      await store.accept(fragments[0], context(t0));
      await store.accept(fragments[2], context(t0));

      const ttls = await ttlsUnder();
      expect(Object.keys(ttls).filter((key) => !isGlobal(key))).toHaveLength(3);
      expect(Object.keys(ttls).filter(isGlobal).length).toBeGreaterThanOrEqual(4);
      for (const [key, ttl] of Object.entries(ttls)) {
        expect({ key, hasTtl: ttl > 0 }).toEqual({ key, hasTtl: true });
      }
    });

    it('keeps TTL upkeep per accept constant as a sliding sequence grows (not a visit of every position)', async () => {
      // A server of its own: INFO commandstats counts every client's commands.
      const server = await OwnedRedisServer.start({ appendOnly: false });
      const own = new Redis(server.url);
      const owned = new RedisSequenceStore(own, { prefix });
      try {
        const n = 300;
        const { fragments, ref } = sequenceFixture(
          scope,
          Array.from({ length: n }, (_, i) => `body-${i}`),
        );
        const sliding = { expiry: { ms: 60_000, strategy: 'sliding' as const } };
        // Each accept a millisecond later: a sliding deadline, so each needs a longer TTL.
        for (let i = 0; i < n - 1; i++) await owned.accept(fragments[i], context(t0 + i, sliding));
        const before = ttlCalls(await own.info('commandstats'));
        await owned.accept(fragments[n - 1], context(t0 + n, sliding));
        const perAccept = ttlCalls(await own.info('commandstats')) - before;
        // Before: every accept visited every stored position (PTTL each), n per accept, n^2 / 2 in all.
        expect(perAccept).toBeLessThan(30);
        expect(Buffer.concat(await readAll(owned.read(ref))).toString()).toBe(
          fragments.map((fragment) => fragment.body.toString()).join(''),
        );
        // Every key still outlives the sequence's deadline.
        for (const key of await keysUnder(own, prefix)) {
          if (isGlobal(key)) continue;
          expect({ key, long: (await own.pttl(key)) >= 60_000 }).toEqual({ key, long: true });
        }
      } finally {
        await owned.close();
        own.disconnect();
        await server.dispose();
      }
    });

    it.each([
      ['finish completed', 'completed'],
      ['finish rejected', 'rejected'],
      ['expire', 'expired'],
    ] as const)(
      'leaves only the marker, with a TTL, after %s; the budget totals return to zero',
      async (_how, outcome) => {
        const { fragments, ref } = sequenceFixture(scope, ['a', 'b', 'c']);
        const short = { expiry: { ms: 1_000, strategy: 'fixed' as const } };
        await store.accept(fragments[0], context(t0, short));
        await store.accept(fragments[1], context(t0, short));

        if (outcome === 'expired') {
          expect(await store.expire(ref, t0 + 1_000, 5_000)).not.toBeNull();
        } else {
          await store.finish(ref, outcome, {
            now: t0,
            retentionMs: 5_000,
            consumerId: 'consumer-a',
          });
        }
        const keys = await lastingKeys();
        expect(keys).toHaveLength(1);
        expect(keys[0]).toMatch(/:done$/);
        const ttl = await redis.pttl(keys[0]);
        expect(ttl).toBeGreaterThan(5_000);
        expect(ttl).toBeLessThanOrEqual(5_000 + 300_000);
        const totals = await redis.hgetall(new RedisKeys(prefix).global.totals);
        expect(totals).toMatchObject({ claimed: '0', stored: '0' });
        expect(await store.stats(t0)).toEqual({
          openSequences: 0,
          bufferedBytes: 0,
          reservedBytes: 0,
        });
      },
    );

    describe('with bodies over the inline limit (a key per body, staged outside Lua)', () => {
      const big = (fill: string) => Buffer.alloc(100 * 1024, fill);

      it('sets a TTL on every key, body keys included, and leaves no staged key', async () => {
        const { fragments, ref } = sequenceFixture(scope, [big('a'), big('b'), big('c')]);
        await store.accept(fragments[0], context(t0));
        await store.accept(fragments[2], context(t0));
        await store.accept(fragments[2], context(t0)); // a duplicate stages, then drops, its body

        const ttls = await ttlsUnder();
        const sequenceKeys = Object.keys(ttls).filter((key) => !isGlobal(key));
        expect(sequenceKeys.filter((key) => /:body:\d+$/.test(key))).toHaveLength(2);
        expect(sequenceKeys.filter((key) => key.includes(':staged:'))).toEqual([]);
        for (const [key, ttl] of Object.entries(ttls)) {
          expect({ key, hasTtl: ttl > 0 }).toEqual({ key, hasTtl: true });
        }
        await store.accept(fragments[1], context(t0));
        const read = Buffer.concat(await readAll(store.read(ref)));
        expect(read.equals(Buffer.concat([big('a'), big('b'), big('c')]))).toBe(true);
      });

      it('opens a sequence whose fragments arrive at once with one reservation, within a budget for one', async () => {
        // Room for the sequence once (each reservation to open it is of its whole declared
        // size), not twice: a reservation per concurrent fragment would back-pressure some.
        const bodies = ['a', 'b', 'c', 'd', 'e', 'f'].map(big);
        const { fragments, ref, payload } = sequenceFixture(scope, bodies);
        const limits = { ...context(t0).limits, maxBufferedBytes: payload.length * 1.5 };
        const results = await Promise.all(
          fragments.map((fragment) => store.accept(fragment, context(t0, { limits }))),
        );
        expect(results.map((result) => result.status).sort()).toEqual([
          'complete',
          'stored',
          'stored',
          'stored',
          'stored',
          'stored',
        ]);
        expect(Buffer.concat(await readAll(store.read(ref))).equals(payload)).toBe(true);
        const keys = await keysUnder(redis, prefix);
        expect(keys.filter((key) => key.includes(':staged:'))).toEqual([]);
      });

      it('sends the body of an open sequence with its first call, and stores it once', async () => {
        const { fragments, ref, payload } = sequenceFixture(scope, [big('p'), big('q'), big('r')]);
        await store.accept(fragments[0], context(t0));
        const before = await redis.info('commandstats');
        expect(await store.accept(fragments[1], context(t0))).toEqual({
          status: 'stored',
          opened: false,
        });
        // The duplicate's body goes with its first call too: dropped, no staged key left.
        expect(await store.accept(fragments[1], context(t0))).toEqual({ status: 'duplicate' });
        const after = await redis.info('commandstats');
        const calls = (info: string, name: string) =>
          Number(new RegExp(`cmdstat_${name}:calls=(\\d+)`).exec(info)?.[1] ?? 0);
        // One accept call each, and the stored one's settle (evalsha; eval when a server first
        // sees a script): without the body first, each accept would take two.
        expect(
          calls(after, 'evalsha') +
            calls(after, 'eval') -
            calls(before, 'evalsha') -
            calls(before, 'eval'),
        ).toBe(3);
        expect((await keysUnder(redis, prefix)).filter((key) => key.includes(':staged:'))).toEqual(
          [],
        );
        await store.accept(fragments[2], context(t0));
        expect(Buffer.concat(await readAll(store.read(ref))).equals(payload)).toBe(true);
      });

      it('sends the body of a streamed sequence once, after the grant each fragment needs', async () => {
        const bodies = [big('s'), big('t'), big('u'), big('v')];
        const { fragments, ref, payload } = sequenceFixture(scope, bodies, {
          streamed: true,
          declareBytes: false,
        });
        const sets = async () =>
          Number(/cmdstat_set:calls=(\d+)/.exec(await redis.info('commandstats'))?.[1] ?? 0);
        const before = await sets();
        for (const fragment of fragments) await store.accept(fragment, context(t0));
        expect((await sets()) - before).toBe(bodies.length);
        expect(Buffer.concat(await readAll(store.read(ref))).equals(payload)).toBe(true);
      });

      it('sends no body ahead of a script call it cannot make (a clock that fails), and leaves no SET unheard', async () => {
        const { fragments } = sequenceFixture(scope, [big('w'), big('x'), big('y')]);
        let broken = false;
        const clocked = new RedisSequenceStore(redis, {
          prefix,
          clock: () => (broken ? Number.NaN : Date.now()),
        });
        const unhandled: unknown[] = [];
        const onUnhandled = (reason: unknown) => unhandled.push(reason);
        process.on('unhandledRejection', onUnhandled);
        try {
          await clocked.accept(fragments[0], context(t0));
          broken = true;
          // The body's first call goes with its staged SET (an open sequence): the call fails.
          await expect(clocked.accept(fragments[1], context(t0))).rejects.toThrow(TypeError);
          expect(
            (await keysUnder(redis, prefix)).filter((key) => key.includes(':staged:')),
          ).toEqual([]);
          // And a SET that fails then is not left with nobody to hear it.
          const set = jest.spyOn(redis, 'set').mockRejectedValue(new Error('SET refused'));
          try {
            await expect(clocked.accept(fragments[1], context(t0))).rejects.toThrow(TypeError);
            await new Promise((resolve) => setTimeout(resolve, 20));
          } finally {
            set.mockRestore();
          }
          expect(unhandled).toEqual([]);
        } finally {
          process.off('unhandledRejection', onUnhandled);
          await clocked.close();
        }
      });

      it.each([
        ['finish completed', 'completed'],
        ['expire', 'expired'],
      ] as const)('leaves only the marker after %s', async (_how, outcome) => {
        const { fragments, ref } = sequenceFixture(scope, [big('x'), big('y'), big('z')]);
        const short = { expiry: { ms: 1_000, strategy: 'fixed' as const } };
        await store.accept(fragments[0], context(t0, short));
        await store.accept(fragments[1], context(t0, short));
        if (outcome === 'expired') {
          expect(await store.expire(ref, t0 + 1_000, 5_000)).not.toBeNull();
        } else {
          await store.finish(ref, outcome, {
            now: t0,
            retentionMs: 5_000,
            consumerId: 'consumer-a',
          });
        }
        const keys = await lastingKeys();
        expect(keys).toHaveLength(1);
        expect(keys[0]).toMatch(/:done$/);
      });

      it.each([
        ['through ioredis', false],
        ['uncopied (unsafeSocketTricks)', true],
      ])(
        'stores and reads large bodies on a client with a keyPrefix, written %s, every key under that prefix',
        async (_, unsafeSocketTricks) => {
          // The staged body key is set through the client (prefixed) and named again inside the
          // accept script: both must be the same key, or no large body is ever stored.
          const keyPrefix = `${prefix}:kp:`; // keysUnder(redis, p) lists p:*
          const prefixed = redisClient({ keyPrefix });
          try {
            const onPrefixed = new RedisSequenceStore(prefixed, {
              prefix: 'app',
              unsafeSocketTricks,
            });
            const bodies = [randomBytes(64 * 1024 + 1), randomBytes(7), randomBytes(300 * 1024)];
            const { fragments, ref } = sequenceFixture(scope, bodies);
            const results = [];
            for (const fragment of [...fragments].reverse()) {
              results.push(await onPrefixed.accept(fragment, context(t0)));
            }
            expect(results.map((result) => result.status)).toEqual([
              'stored',
              'stored',
              'complete',
            ]);
            expect(
              Buffer.concat(await readAll(onPrefixed.read(ref))).equals(Buffer.concat(bodies)),
            ).toBe(true);
            // Two large bodies, each renamed from its staged key: nothing staged is left behind.
            const keys = await keysUnder(redis, `${prefix}:kp`);
            expect(keys.filter((key) => /:body:\d+$/.test(key))).toHaveLength(2);
            expect(keys.filter((key) => key.includes(':staged:'))).toEqual([]);
            expect(await keysUnder(redis, 'app')).toEqual([]);
            await onPrefixed.close();
          } finally {
            await deleteUnder(redis, `${prefix}:kp`);
            await prefixed.quit();
          }
        },
      );

      it('reads small bodies whole and large ones in pieces that need not divide them, in order', async () => {
        // Through the client, so that each piece is one chunk (read directly, a piece comes in
        // the socket's chunks).
        const pieced = new RedisSequenceStore(redis, {
          prefix,
          readAhead: 3,
          readPieceBytes: 64 * 1024,
        });
        // Inline (≤ 64 KiB), then bodies of 1, 2 and 3 pieces, the last ones short.
        const bodies = [7, 64 * 1024 + 1, 200 * 1024 + 13, 5, 128 * 1024].map((bytes) =>
          randomBytes(bytes),
        );
        const { fragments, ref } = sequenceFixture(scope, bodies);
        for (const fragment of [...fragments].reverse()) {
          await pieced.accept(fragment, context(t0));
        }
        const chunks = await readAll(pieced.read(ref));
        expect(chunks.map((chunk) => chunk.length)).toEqual([
          7,
          64 * 1024,
          1,
          64 * 1024,
          64 * 1024,
          64 * 1024,
          8 * 1024 + 13,
          5,
          64 * 1024,
          64 * 1024,
        ]);
        expect(Buffer.concat(chunks).equals(Buffer.concat(bodies))).toBe(true);
      });

      it('reads a sequence of under 1 MiB of large bodies through the client, a larger one directly (unsafeSocketTricks)', async () => {
        const name = `nseq-test-${randomUUID()}`;
        const named = redisClient({ connectionName: name });
        try {
          await named.ping();
          const pieced = new RedisSequenceStore(named, {
            prefix,
            readPieceBytes: 64 * 1024,
            unsafeSocketTricks: true,
          });
          const directConnections = async () => (await directReadsConnections(redis, name)).length;
          const small = sequenceFixture(scope, [randomBytes(500 * 1024), randomBytes(500 * 1024)]);
          for (const fragment of small.fragments) await pieced.accept(fragment, context(t0));
          const smallParts = await readAll(pieced.read(small.ref));
          expect(Buffer.concat(smallParts).equals(small.payload)).toBe(true);
          expect(await directConnections()).toBe(0);
          // Through the client: one chunk per piece of 64 KiB, 8 per body.
          expect(smallParts).toHaveLength(16);

          const large = sequenceFixture(`${scope}-l`, [randomBytes(MiB), randomBytes(300 * 1024)]);
          for (const fragment of large.fragments) await pieced.accept(fragment, context(t0));
          const largeParts = await readAll(pieced.read(large.ref));
          expect(Buffer.concat(largeParts).equals(large.payload)).toBe(true);
          expect(await directConnections()).toBe(1);
          // Each part a view of a socket chunk, handed on as it is: never two joined into one.
          expect(largeParts.length).toBeGreaterThan((MiB + 300 * 1024) / (64 * 1024));
          await pieced.close();
        } finally {
          await named.quit();
        }
      });

      it('finishes a read byte-exact when its own connection for reads is killed midway (unsafeSocketTricks)', async () => {
        const name = `nseq-test-${randomUUID()}`;
        const named = redisClient({ connectionName: name });
        try {
          const pieced = new RedisSequenceStore(named, {
            prefix,
            readAhead: 2,
            readPieceBytes: 64 * 1024,
            unsafeSocketTricks: true,
          });
          const bodies = [randomBytes(600 * 1024), randomBytes(600 * 1024)];
          const { fragments, ref } = sequenceFixture(scope, bodies);
          for (const fragment of fragments) await pieced.accept(fragment, context(t0));
          const received: Buffer[] = [];
          let killed = 0;
          for await (const chunk of pieced.read(ref)) {
            received.push(chunk as Buffer);
            if (received.length === 1) {
              killed = await killDirectReadsConnection(redis, name);
            }
          }
          expect(killed).toBe(1);
          expect(Buffer.concat(received).equals(Buffer.concat(bodies))).toBe(true);
          await pieced.close();
        } finally {
          await named.quit();
        }
      });

      it('checks each large body read in pieces against its CRC-32, and fails on a changed byte', async () => {
        const pieced = new RedisSequenceStore(redis, { prefix, readPieceBytes: 64 * 1024 });
        expect(pieced.verifiesReads).toBe(true);
        const { fragments, ref } = sequenceFixture(scope, [big('a'), big('b'), big('c')]);
        for (const fragment of fragments) await pieced.accept(fragment, context(t0));
        // One byte of the second body's second piece, same length: only the CRC-32 can tell.
        const [bodyKey] = (await sequenceKeysUnder()).filter((key) => key.endsWith(':body:2'));
        await redis.setrange(bodyKey, 70 * 1024, 'X');
        const received: Buffer[] = [];
        const reading = (async () => {
          for await (const chunk of pieced.read(ref)) received.push(chunk as Buffer);
        })();
        await expect(reading).rejects.toBeInstanceOf(StoredFragmentIntegrityError);
        await expect(reading).rejects.toMatchObject({
          sequenceId: ref.sequenceId,
          position: 2,
          expectedCrc32: crc32(big('b')),
        });
        // The first body, and the second's first piece, but never the changed piece.
        expect(
          Buffer.concat(received).equals(
            Buffer.concat([big('a'), big('b').subarray(0, 64 * 1024)]),
          ),
        ).toBe(true);
      });

      it('plans the read of a sequence of more bodies than one planning round trip asks for (512)', async () => {
        // 700 bodies, one in ten large: two planning batches, small and large bodies in each.
        const bodies = Array.from({ length: 700 }, (_, index) =>
          randomBytes(index % 10 === 9 ? 70 * 1024 : 1 + (index % 7)),
        );
        const { fragments, ref } = sequenceFixture(scope, bodies);
        for (const fragment of fragments) await store.accept(fragment, context(t0));
        const read = Buffer.concat(await readAll(store.read(ref)));
        expect(read.equals(Buffer.concat(bodies))).toBe(true);
      });

      it('fails the read, rather than ending it short, when a large body goes while it is read', async () => {
        const pieced = new RedisSequenceStore(redis, {
          prefix,
          readAhead: 1,
          readPieceBytes: 64 * 1024,
        });
        const { fragments, ref } = sequenceFixture(scope, [big('a'), big('b'), big('c')]);
        for (const fragment of fragments) await pieced.accept(fragment, context(t0));
        const reading = pieced.read(ref);
        const received: Buffer[] = [];
        const done = (async () => {
          for await (const chunk of reading) {
            received.push(chunk as Buffer);
            // Once the read is under way, the third body disappears (as if expired meanwhile).
            if (received.length === 1) {
              const [bodyKey] = (await sequenceKeysUnder()).filter((key) =>
                key.endsWith(':body:3'),
              );
              await redis.del(bodyKey);
            }
          }
        })();
        await expect(done).rejects.toThrow(/position 3 is gone/);
        expect(Buffer.concat(received).length).toBeLessThan(3 * 100 * 1024);
      });
    });

    it('keeps every key of a sequence in one hash slot, and the global keys in another, whatever the scope', async () => {
      const scopes = ['orders', 'a{b}c', '{', '}x{', 'x:y:z', 'per%cent %7B', 'ümlaut ✓', ''];
      const expiry = { ms: 1_000, strategy: 'fixed' as const };
      const refs = [];
      for (const odd of scopes) {
        const { fragments, ref } = sequenceFixture(odd, ['1', '2']);
        await store.accept(fragments[0], context(t0, { expiry }));
        refs.push(ref);
      }

      const keys = await keysUnder(redis, prefix);
      const bySequence = new Map<string, string[]>();
      for (const key of keys.filter((name) => !isGlobal(name))) {
        const sequence = key.slice(0, key.lastIndexOf(':'));
        bySequence.set(sequence, [...(bySequence.get(sequence) ?? []), key]);
      }
      expect(bySequence.size).toBe(scopes.length);
      for (const [sequence, sequenceKeys] of bySequence) {
        expect({ sequence, slot: calculateSlot.generateMulti(sequenceKeys) }).not.toMatchObject({
          slot: -1,
        });
      }
      expect(calculateSlot.generateMulti(keys.filter(isGlobal))).not.toBe(-1);
      expect(new Set(keys.map((key) => calculateSlot(key))).size).toBeGreaterThan(2);

      const listed = await store.listExpired(t0 + 1_000, 100);
      expect(listed).toHaveLength(scopes.length);
      expect(listed).toEqual(expect.arrayContaining(refs));
      for (const ref of refs) {
        await store.finish(ref, 'rejected', { now: t0, retentionMs: 1, consumerId: 'consumer-a' });
      }
    });

    it.each([
      ['through the client', false],
      ['on a connection of their own, without copying (unsafeSocketTricks)', true],
    ])(
      'streams a 64 MiB sequence of 8 MiB bodies byte-exact, in 1 MiB pieces read %s, a bounded number at a time',
      async (_, directReads) => {
        const reader = new RedisSequenceStore(redis, {
          prefix,
          readAhead: 1,
          readPieceBytes: MiB,
          unsafeSocketTricks: directReads,
        });
        const ref = { scope, sequenceId: `seq-${randomUUID()}` };
        const written = createHash('sha256');
        for (let position = 1; position <= 8; position++) {
          const body = randomBytes(8 * MiB);
          written.update(body);
          const result = await reader.accept(
            {
              ...ref,
              position,
              size: 8,
              last: position === 8,
              crc32: crc32(body),
              bytes: 64 * MiB,
              userHeaders: {},
              body,
            },
            context(t0),
          );
          expect(result.status).toBe(position === 8 ? 'complete' : 'stored');
        }

        // Counts the pieces the reader holds (fetching, or fetched and not yet handed out): a plain
        // wrapper, since a jest spy would keep every piece it returned.
        let fetching = 0;
        let fetched = 0;
        let consumed = 0;
        let mostFetching = 0;
        let mostHeldPieces = 0;
        // Small bodies are read whole with HGET (from the body hash), large ones by range: count both.
        const countFetch =
          <A extends unknown[]>(fetch: (...args: A) => Promise<Buffer | null>) =>
          async (...args: A) => {
            mostFetching = Math.max(mostFetching, ++fetching);
            try {
              return await fetch(...args);
            } finally {
              fetching--;
              fetched++;
            }
          };
        let throughClient = 0;
        const countClientFetch =
          <A extends unknown[]>(fetch: (...args: A) => Promise<Buffer | null>) =>
          (...args: A) => {
            throughClient++;
            return fetch(...args);
          };
        Object.assign(redis, {
          hgetBuffer: countFetch(redis.hgetBuffer.bind(redis)),
          getrangeBuffer: countClientFetch(countFetch(redis.getrangeBuffer.bind(redis))),
        });
        const directGetRange = Object.getOwnPropertyDescriptor(
          RedisDirectReads.prototype,
          'getRange',
        ) as PropertyDescriptor;
        const getRange = RedisDirectReads.prototype.getRange;
        RedisDirectReads.prototype.getRange = async function (this: RedisDirectReads, ...args) {
          mostFetching = Math.max(mostFetching, ++fetching);
          try {
            return await getRange.apply(this, args);
          } finally {
            fetching--;
            fetched++;
          }
        };
        const gc = exposedGc();
        /** ArrayBuffer memory in use, once dead buffers are swept (which V8 finishes lazily). */
        const arrayBuffersInUse = async () => {
          gc();
          await new Promise((resolve) => setImmediate(resolve));
          gc();
          return process.memoryUsage().arrayBuffers;
        };
        const baseline = await arrayBuffersInUse();
        let mostGrowth = 0;
        const read = createHash('sha256');
        const chunkSizes: number[] = [];
        let pieceBytes = 0;
        try {
          for await (const chunk of reader.read(ref)) {
            const bytes = (chunk as Buffer).length;
            chunkSizes.push(bytes);
            // Measured at the first part of each piece: a full collection per part would be slow.
            const firstPart = pieceBytes === 0;
            pieceBytes += bytes;
            // A piece's parts come one chunk each: the piece is consumed with its last part.
            if (pieceBytes === MiB) {
              consumed++;
              pieceBytes = 0;
            }
            mostHeldPieces = Math.max(mostHeldPieces, fetching + fetched - consumed);
            read.update(chunk as Buffer);
            if (firstPart) {
              mostGrowth = Math.max(mostGrowth, (await arrayBuffersInUse()) - baseline);
            }
          }
        } finally {
          Reflect.deleteProperty(redis, 'hgetBuffer');
          Reflect.deleteProperty(redis, 'getrangeBuffer');
          Object.defineProperty(RedisDirectReads.prototype, 'getRange', directGetRange);
          await reader.close();
        }

        if (directReads) {
          // Each piece as the socket delivered it: parts of at most the socket's chunk size.
          expect(chunkSizes.length).toBeGreaterThan(64);
          expect(Math.max(...chunkSizes)).toBeLessThan(MiB);
        } else {
          expect(chunkSizes).toEqual(Array.from({ length: 64 }, () => MiB));
        }
        expect(throughClient).toBe(directReads ? 0 : 64);
        expect(fetched).toBe(64);
        expect(read.digest('hex')).toBe(written.digest('hex'));
        // Besides the part in the consumer's hands: readAhead (1) fetching + the piece it is from.
        expect(mostFetching).toBe(1);
        expect(mostHeldPieces).toBeLessThanOrEqual(2);
        // Never a whole 8 MiB body: a few pieces of 1 MiB, each with the socket chunks it came in.
        expect(mostGrowth).toBeLessThan(8 * MiB);
      },
    );

    it('lists a budget record whose consumer died before storing, and expire then frees it', async () => {
      const keys = new RedisKeys(prefix);
      const budget = new RedisBudget(redis, loadScripts(redis), keys, 300_000);
      const { ref } = sequenceFixture(scope, ['a', 'b']);
      await budget.reserve(keys.member(ref), 2, {
        now: t0,
        provisionalDue: t0 + 1_000,
        limits: context(t0).limits,
        ttl: 60_000,
      });
      expect(await store.stats(t0)).toMatchObject({ openSequences: 1 });

      expect(await store.listExpired(t0 + 1_000, 10)).toEqual([ref]);
      expect(await store.expire(ref, t0 + 1_000, 5_000)).toBeNull();
      expect(await store.listExpired(t0 + 1_000, 10)).toEqual([]);
      expect(await store.stats(t0)).toEqual({
        openSequences: 0,
        bufferedBytes: 0,
        reservedBytes: 0,
      });
    });

    it('never lets a sequence open on a reservation whose epoch the sweeper fenced', async () => {
      const keys = new RedisKeys(prefix);
      const scripts = loadScripts(redis);
      const budget = new RedisBudget(redis, scripts, keys, 300_000);
      const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
      const stalled = await budget.reserve(keys.member(ref), 2, {
        now: t0,
        provisionalDue: t0 + 1_000,
        limits: context(t0).limits,
        ttl: 60_000,
      });
      expect(stalled.kind).toBe('granted');
      expect(await store.expire(ref, t0 + 1_000, 5_000)).toBeNull();

      const args = acceptArguments(
        fragments[0],
        context(t0),
        stalled.kind === 'granted' ? stalled.grant : NO_GRANT,
        300_000,
        true,
      );
      const reply = (await scripts.accept(sequenceKeyList(keys.sequence(ref)), args)) as unknown[];
      expect(reply[0]).toBe('void');
      expect(await store.stats(t0)).toEqual({
        openSequences: 0,
        bufferedBytes: 0,
        reservedBytes: 0,
      });

      expect(await store.accept(fragments[0], context(t0))).toEqual({
        status: 'stored',
        opened: true,
      });
      expect(await store.stats(t0)).toMatchObject({
        openSequences: 1,
        bufferedBytes: storedChargeOf(1),
      });
    });

    it('neither stores twice nor refunds twice when the client resends an accept after a reconnect', async () => {
      const keys = new RedisKeys(prefix);
      const scripts = loadScripts(redis);
      const budget = new RedisBudget(redis, scripts, keys, 300_000);
      const { fragments, ref } = sequenceFixture(scope, ['aaaa', 'bb'], { declareBytes: false });
      const member = keys.member(ref);
      const reservation = await budget.reserve(
        member,
        storedChargeOf(4) + FRAGMENT_OVERHEAD_BYTES + 10,
        {
          now: t0,
          provisionalDue: t0 + 60_000,
          limits: context(t0).limits,
          ttl: 60_000,
        },
      );
      const grant = reservation.kind === 'granted' ? reservation.grant : NO_GRANT;
      const call = () =>
        scripts.accept(
          sequenceKeyList(keys.sequence(ref)),
          acceptArguments(fragments[0], context(t0), grant, 300_000, true),
        );

      const first = interpretAccept(await call(), ref);
      expect(first).toMatchObject({ kind: 'result', result: { status: 'stored', opened: true } });
      if (first.kind === 'result' && first.settlement)
        await budget.settle(member, first.settlement);
      const resent = interpretAccept(await call(), ref);
      expect(resent).toMatchObject({ kind: 'result', result: { status: 'duplicate' } });
      expect(resent.kind === 'result' && resent.settlement).toBeFalsy();

      expect(await redis.hget(keys.global.totals, 'claimed')).toBe(
        String(storedChargeOf(4) + FRAGMENT_OVERHEAD_BYTES),
      );
      expect(await store.stats(t0)).toMatchObject({
        openSequences: 1,
        bufferedBytes: storedChargeOf(4),
      });
    });

    it.each(['completed', 'failed'] as const)(
      'answers a %s finish resent after a reconnect as it answered it, and no other holder so',
      async (outcome) => {
        const keys = new RedisKeys(prefix);
        const scripts = loadScripts(redis);
        const { fragments, ref } = sequenceFixture(scope, ['abc', 'def']);
        for (const fragment of fragments) await store.accept(fragment, context(t0));
        const call = (consumerId: string) =>
          scripts.finish(sequenceKeyList(keys.sequence(ref)), [
            outcome,
            t0,
            60_000,
            'handler failed',
            300_000,
            consumerId,
          ]) as Promise<number[]>;

        const first = (await call('consumer-a')).map(Number);
        expect(first[0]).toBe(1);
        const resent = (await call('consumer-a')).map(Number);
        // The same answer but the marker's TTL, a few ms lower by now.
        expect(resent.slice(0, 5)).toEqual(first.slice(0, 5));
        expect((await call('consumer-b')).map(Number)).toEqual([0]);
      },
    );

    it('answers an expire resent after a reconnect with its expiry, and another sweeper stale', async () => {
      const keys = new RedisKeys(prefix);
      const scripts = loadScripts(redis);
      const { fragments, ref } = sequenceFixture(scope, ['abc', 'def']);
      await store.accept(fragments[0], context(t0));
      const epoch = await new RedisBudget(redis, scripts, keys, 300_000).epochOf(keys.member(ref));
      const call = (token: string) =>
        scripts.expire(sequenceKeyList(keys.sequence(ref)), [
          t0 + 120_000,
          60_000,
          epoch!,
          300_000,
          token,
        ]) as Promise<unknown[]>;

      const first = await call('sweep-1');
      expect(first[0]).toBe('expired');
      expect(await call('sweep-1')).toEqual(first);
      expect((await call('sweep-2'))[0]).toBe('stale');
    });

    it("evicts failed sequences' kept fragments before back-pressuring for them", async () => {
      // Room for one of the two sequences below, not for both.
      const limits = { ...context(t0).limits, maxBufferedBytes: 3_000 };
      const failed = sequenceFixture(scope, ['f'.repeat(600)]);
      await store.accept(failed.fragments[0], context(t0, { limits }));
      await store.finish(failed.ref, 'failed', {
        now: t0,
        retentionMs: 60_000,
        consumerId: 'consumer-a',
      });
      expect(await store.stats(t0)).toMatchObject({ bufferedBytes: storedChargeOf(600) });

      const next = sequenceFixture(scope, ['n'.repeat(500), 'm']);
      expect(await store.accept(next.fragments[0], context(t0, { limits }))).toEqual({
        status: 'stored',
        opened: true,
      });
      expect(await store.stats(t0)).toMatchObject({ bufferedBytes: storedChargeOf(500) });
      await expect(readAll(store.read(failed.ref))).rejects.toThrow(/not complete/);
      expect(await store.accept(failed.fragments[0], context(t0, { limits }))).toMatchObject({
        status: 'finished',
        outcome: 'failed',
      });
    });

    /** Makes the store's next budget `forget` (the index step after a finish) fail once. */
    function failNextForget(): void {
      const budget = (store as unknown as { budget: RedisBudget }).budget;
      const forget = budget.forget.bind(budget);
      budget.forget = async () => {
        budget.forget = forget;
        throw new Error('index unreachable');
      };
    }

    it('keeps a failed finish when its index step fails, and the sweep then counts the kept fragments until they go', async () => {
      const limits = { ...context(t0).limits, maxBufferedBytes: 3_000 };
      const failed = sequenceFixture(scope, ['f'.repeat(600), 'g']);
      await store.accept(failed.fragments[0], context(t0, { limits }));
      failNextForget();

      await expect(
        store.finish(failed.ref, 'failed', {
          now: t0,
          retentionMs: 120_000,
          consumerId: 'consumer-a',
        }),
      ).resolves.toBe(true);
      expect(await store.accept(failed.fragments[1], context(t0, { limits }))).toMatchObject({
        status: 'finished',
        outcome: 'failed',
      });

      const due = t0 + 61_000;
      expect(await store.listExpired(due, 10)).toEqual([failed.ref]);
      expect(await store.expire(failed.ref, due, 120_000)).toBeNull();
      expect(await store.listExpired(due, 10)).toEqual([]);
      expect(await store.stats(due)).toEqual({
        openSequences: 0,
        bufferedBytes: storedChargeOf(600),
        reservedBytes: 0,
      });
      await store.listExpired(t0 + 121_000, 10);
      expect(await store.stats(t0 + 121_000)).toEqual({
        openSequences: 0,
        bufferedBytes: 0,
        reservedBytes: 0,
      });
    });

    it('reports an expired sequence once when the index step after expiring it fails', async () => {
      const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
      await store.accept(fragments[0], context(t0));
      const due = t0 + 61_000;
      failNextForget();

      const expired = await store.expire(ref, due, 5_000);

      expect(expired).toMatchObject({ sequenceId: ref.sequenceId, receivedPositions: [1] });
      expect(await store.listExpired(due, 10)).toEqual([ref]);
      expect(await store.expire(ref, due, 5_000)).toBeNull();
      expect(await store.listExpired(due, 10)).toEqual([]);
      expect(await store.stats(due)).toEqual({
        openSequences: 0,
        bufferedBytes: 0,
        reservedBytes: 0,
      });
    });

    it('forgets the sums of sequences whose keys all expired while no consumer ran', async () => {
      const limits = { ...context(t0).limits, maxBufferedBytes: 3_000 };
      const gone = sequenceFixture(scope, ['g'.repeat(400), 'h'.repeat(400)]);
      await store.accept(gone.fragments[0], context(t0, { limits }));
      // What TTL expiry does when every consumer is away longer than the keys' TTLs: the
      // sequence's keys and the index go; the totals hash, renewed last with a longer TTL, stays.
      const keys = new RedisKeys(prefix);
      await redis.del(keys.global.open, keys.global.due, keys.global.first);
      await redis.del(...(await sequenceKeysUnder()));
      expect(await redis.exists(keys.global.totals)).toBe(1);

      expect(await store.stats(t0)).toEqual({
        openSequences: 0,
        bufferedBytes: 0,
        reservedBytes: 0,
      });
      const next = sequenceFixture(scope, ['n'.repeat(500), 'm']);
      expect(await store.accept(next.fragments[0], context(t0, { limits }))).toEqual({
        status: 'stored',
        opened: true,
      });
      expect(await store.stats(t0)).toEqual({
        openSequences: 1,
        bufferedBytes: storedChargeOf(500),
        reservedBytes: FRAGMENT_OVERHEAD_BYTES + 1,
        oldestOpenAt: t0,
      });
    });

    it('rejects, rather than hangs, when Redis cannot be reached', async () => {
      const unreachable = RedisSequenceStore.connect('redis://127.0.0.1:1', {
        prefix,
        redis: { enableOfflineQueue: false, retryStrategy: () => null, lazyConnect: true },
      });
      const { fragments } = sequenceFixture(scope, ['a']);

      await expect(unreachable.accept(fragments[0], context(t0))).rejects.toThrow();
      await expect(unreachable.ping()).rejects.toThrow();
      await unreachable.close();
    });

    it('quits the client it created on close, and only that one', async () => {
      const owned = RedisSequenceStore.connect(SERVERS.redis.url, { prefix });
      await owned.ping();
      await owned.close();
      await expect(owned.ping()).rejects.toThrow();

      await store.close();
      await expect(store.ping()).resolves.toBeUndefined();
    });
  });
});
