import calculateSlot from 'cluster-key-slot';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { describeClaimLedgerConformance } from '../../../testing/conformance/claim-ledger.conformance';
import { SERVERS, describeWithServer } from '../../../../test/support/servers';
import { deleteUnder, keysUnder, redisClient } from '../../../../test/support/redis.fixture';
import type { ClaimKey, ClaimLedger } from '../../../ports/claim-ledger.port';
import { RedisClaimKeys } from './redis-claim-keys';
import { RedisClaimLedger } from './redis.claim-ledger';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

const LEASE_MS = 30_000;
const RETAIN_MS = 3_600_000;
const MARGIN_MS = 60_000;

describeWithServer('redis', 'RedisClaimLedger (Redis at REDIS_URL)', () => {
  let redis: Redis;

  beforeAll(() => {
    redis = redisClient();
  });

  afterAll(async () => {
    await redis.quit();
  });

  describe('conformance', () => {
    /** Prefix of each ledger the harness created (peers are not in it: they own a client). */
    const prefixes = new Map<ClaimLedger, string>();

    for (const [name, unsafeSocketTricks] of [
      ['redis', false],
      ['redis (unsafeSocketTricks)', true],
    ] as const) {
      describeClaimLedgerConformance(name, {
        create: async () => {
          const prefix = `nseq-test:${randomUUID()}`;
          const ledger = new RedisClaimLedger(redis, { prefix, unsafeSocketTricks });
          prefixes.set(ledger, prefix);
          return ledger;
        },
        // A second consumer instance: its own connection, the same keys.
        peer: async (ledger) =>
          RedisClaimLedger.connect(SERVERS.redis.url, {
            prefix: prefixes.get(ledger)!,
            unsafeSocketTricks,
          }),
        close: async (ledger) => {
          await ledger.close();
          const prefix = prefixes.get(ledger);
          if (prefix === undefined) return;
          prefixes.delete(ledger);
          await deleteUnder(redis, prefix);
          expect(await keysUnder(redis, prefix)).toEqual([]);
        },
      });
    }
  });

  describe('RedisClaimLedger', () => {
    let prefix: string;
    let ledger: RedisClaimLedger;
    let keys: RedisClaimKeys;
    let key: ClaimKey;
    let t0: number;

    beforeEach(() => {
      prefix = `nseq-test:${randomUUID()}`;
      ledger = new RedisClaimLedger(redis, { prefix });
      keys = new RedisClaimKeys(prefix);
      key = { ticket: `redis:${randomUUID()}`, group: 'orders.created' };
      t0 = Date.now();
    });

    afterEach(async () => {
      await ledger.close();
      await deleteUnder(redis, prefix);
    });

    it('gives every key it writes a TTL', async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);
      await ledger.claim({ ...key, group: 'audit' }, 'b', LEASE_MS, t0);
      await ledger.complete({ ...key, group: 'billing' }, 'c', t0 + RETAIN_MS, t0);
      await ledger.claim({ ...key, group: 'billing' }, 'c', LEASE_MS, t0 + 1);
      await ledger.complete(key, 'a', t0 + RETAIN_MS, t0 + 2);

      const written = await keysUnder(redis, prefix);
      expect(written.sort()).toEqual(
        [keys.of(key).done, keys.of({ ...key, group: 'audit' }).lease].sort(),
      );
      for (const name of written) expect(await redis.pttl(name)).toBeGreaterThan(0);
    });

    it('keeps a lease key for leaseMs plus the margin', async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);

      const ttl = await redis.pttl(keys.of(key).lease);
      expect(ttl).toBeLessThanOrEqual(LEASE_MS + MARGIN_MS);
      expect(ttl).toBeGreaterThan(LEASE_MS + MARGIN_MS - 5_000);
    });

    it('keeps the done key until the latest retainUntil of its groups plus the margin', async () => {
      await ledger.complete(key, 'a', t0 + 50_000, t0);
      await ledger.complete({ ...key, group: 'audit' }, 'a', t0 + 10_000, t0);

      const ttl = await redis.pttl(keys.of(key).done);
      expect(ttl).toBeLessThanOrEqual(50_000 + MARGIN_MS);
      expect(ttl).toBeGreaterThan(50_000 + MARGIN_MS - 5_000);
    });

    it('removes the lease key when its holder releases it', async () => {
      await ledger.claim(key, 'a', LEASE_MS, t0);
      await ledger.release(key, 'a');

      expect(await keysUnder(redis, prefix)).toEqual([]);
    });

    it('lets Redis drop records in real time once their time and the margin have passed', async () => {
      const noMargin = new RedisClaimLedger(redis, { prefix, keyTtlMarginMs: 0 });
      await noMargin.claim(key, 'a', 100, Date.now());
      await noMargin.complete({ ...key, group: 'audit' }, 'a', Date.now() + 100, Date.now());
      expect(await keysUnder(redis, prefix)).toHaveLength(2);

      await sleep(300);

      expect(await keysUnder(redis, prefix)).toEqual([]);
    });

    describe('hostile tickets and groups', () => {
      const tickets = ['fs:{a}b', 'fs:{a}c', '}{', '{', '}', '{}', 'x{y}z{w}', 'a:{claim:00}'];
      const groups = ['orders', '{orders}', '}{', 'a:{b}'];

      it('keeps all keys of one ticket in one cluster slot', async () => {
        for (const ticket of tickets) {
          for (const group of groups) {
            await ledger.claim({ ticket, group }, 'a', LEASE_MS, t0);
          }
          await ledger.complete({ ticket, group: groups[0] }, 'a', t0 + RETAIN_MS, t0);
        }

        const written = await keysUnder(redis, prefix);
        for (const ticket of tickets) {
          const tag = keys.tagOf(ticket);
          const own = written.filter((name) => name.startsWith(`${tag}:`));
          expect(own).toHaveLength(groups.length);
          expect(calculateSlot.generateMulti(own)).toBe(calculateSlot(tag));
        }
        expect(written).toHaveLength(tickets.length * groups.length);
      });

      it('keeps tickets that differ only after a brace apart', async () => {
        await ledger.complete({ ticket: 'fs:{a}b', group: 'orders' }, 'a', t0 + RETAIN_MS, t0);

        await expect(
          ledger.claim({ ticket: 'fs:{a}c', group: 'orders' }, 'b', LEASE_MS, t0),
        ).resolves.toBe('claimed');
        await expect(
          ledger.claim({ ticket: 'fs:{a}b', group: 'orders' }, 'b', LEASE_MS, t0),
        ).resolves.toBe('done');
      });

      it('keeps a group with braces apart from the group its braces enclose', async () => {
        await ledger.claim({ ...key, group: '{orders}' }, 'a', LEASE_MS, t0);

        await expect(ledger.claim({ ...key, group: 'orders' }, 'b', LEASE_MS, t0)).resolves.toBe(
          'claimed',
        );
      });
    });

    it('rejects a prefix with braces', () => {
      expect(() => new RedisClaimLedger(redis, { prefix: 'nseq{x}' })).toThrow(/\{ or \}/);
    });

    it('rejects a negative keyTtlMarginMs', () => {
      expect(() => new RedisClaimLedger(redis, { prefix, keyTtlMarginMs: -1 })).toThrow(
        SequenceOptionsError,
      );
    });

    it('rejects an unsafeSocketTricks that is not a boolean', () => {
      expect(
        () => new RedisClaimLedger(redis, { prefix, unsafeSocketTricks: 'yes' as never }),
      ).toThrow(/unsafeSocketTricks must be true or false/);
    });

    it('connects a client of its own and quits it on close', async () => {
      const own = RedisClaimLedger.connect(SERVERS.redis.url, { prefix });
      await expect(own.claim(key, 'a', LEASE_MS, t0)).resolves.toBe('claimed');

      await own.close();

      await expect(own.ping()).rejects.toThrow();
      await expect(ledger.claim(key, 'b', LEASE_MS, t0 + 1)).resolves.toBe('busy');
    });

    it('leaves a client passed in open on close', async () => {
      await ledger.close();

      await expect(redis.ping()).resolves.toBe('PONG');
    });

    it('rejects ping when Redis cannot be reached', async () => {
      const unreachable = RedisClaimLedger.connect('redis://127.0.0.1:1', {
        prefix,
        // No retries, and no 2 s wait to destroy the refused socket (which would hold jest open).
        redis: {
          lazyConnect: true,
          maxRetriesPerRequest: 0,
          retryStrategy: () => null,
          disconnectTimeout: 10,
        },
      });
      try {
        await expect(unreachable.ping()).rejects.toThrow();
      } finally {
        await unreachable.close();
      }
    });
  });
});
