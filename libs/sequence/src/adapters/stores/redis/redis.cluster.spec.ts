import { randomBytes, randomUUID } from 'node:crypto';
import { Cluster } from 'ioredis';
import { describeClaimLedgerConformance } from '../../../testing/conformance/claim-ledger.conformance';
import { describePayloadStoreConformance } from '../../../testing/conformance/payload-store.conformance';
import { describeResequencerStoreConformance } from '../../../testing/conformance/resequencer-store.conformance';
import {
  readAll,
  sequenceFixture,
  storedChargeOf,
  describeSequenceStoreConformance,
} from '../../../testing/conformance/sequence-store.conformance';
import {
  keysUnder,
  LocalCluster,
  redisServerInstalled,
} from '../../../../test/support/processes/redis-cluster';
import type { ClaimLedger } from '../../../ports/claim-ledger.port';
import type { PayloadStore } from '../../../ports/payload-store.port';
import type { ResequencerStore } from '../../../ports/resequencer-store.port';
import type { AcceptContext, SequenceStore } from '../../../ports/sequence-store.port';
import { RedisPayloadKeys } from '../../payload/redis/redis-payload-keys';
import { RedisPayloadStore } from '../../payload/redis/redis.payload-store';
import { RedisClaimKeys } from './redis-claim-keys';
import { RedisKeys } from './redis-keys';
import { RedisClaimLedger } from './redis.claim-ledger';
import { indexKeyList, RedisResequencerKeys } from './redis-resequencer-keys';
import { loadScripts } from './redis-scripts';
import { RedisResequencerStore } from './redis.resequencer-store';
import { RedisSequenceStore } from './redis.sequence-store';

const inCi = process.env.CI === 'true' || process.env.CI === '1';

const suite = redisServerInstalled() || inCi ? describe : describe.skip;
if (suite === describe.skip) {
  console.warn('skipping the Redis Cluster tests: redis-server is not installed');
}

// One cluster for every adapter in this file: starting one costs seconds of CI time.
suite('Redis adapters on a 3-master Redis Cluster', () => {
  const local = new LocalCluster();
  let cluster: Cluster;

  /** A client of its own on the cluster, as another consumer instance would have. */
  const connect = () => new Cluster(local.ports.map((port) => ({ host: '127.0.0.1', port })));

  beforeAll(async () => {
    try {
      await local.start();
    } catch (error) {
      throw new Error(`could not start the Redis Cluster: ${String(error)}\n${local.describe()}`);
    }
    cluster = connect();
    await cluster.ping();
  }, 60_000);

  afterAll(async () => {
    await cluster?.quit().catch(() => cluster.disconnect());
    await local.stop();
  }, 30_000);

  const uniquePrefix = () => `nseq-test:${randomUUID()}`;

  /** Removes what a store left under `prefix` on every master, and proves nothing remains. */
  async function removeKeysUnder(prefix: string): Promise<void> {
    for (const [node, key] of await keysUnder(cluster, prefix)) await node.unlink(key);
    expect(await keysUnder(cluster, prefix)).toEqual([]);
  }

  /** The one slot all of `keys` hash to (the test fails when they span several). */
  async function slotOf(keys: string[]): Promise<number> {
    const slots = new Set<number>();
    for (const key of keys) slots.add(Number(await cluster.cluster('KEYSLOT', key)));
    expect(slots.size).toBe(1);
    return [...slots][0];
  }

  /** host:port of the master serving a slot. */
  async function slotOwner(slot: number): Promise<string> {
    const ranges = await cluster.cluster('SLOTS');
    const [, , master] = ranges.find(([from, to]) => slot >= from && slot <= to) ?? [];
    return master ? `${master[0]}:${master[1]}` : 'none';
  }

  describe('RedisSequenceStore', () => {
    const prefixes = new Map<SequenceStore, string>();

    async function create(): Promise<RedisSequenceStore> {
      const prefix = uniquePrefix();
      const store = new RedisSequenceStore(cluster, { prefix });
      prefixes.set(store, prefix);
      return store;
    }

    async function close(store: SequenceStore): Promise<void> {
      await store.close();
      const prefix = prefixes.get(store)!;
      prefixes.delete(store);
      await removeKeysUnder(prefix);
    }

    describeSequenceStoreConformance('redis on Redis Cluster', { create, close });

    /** Limits that let every sequence of these tests (up to `maxSequenceBytes` each) in. */
    const acceptContext = (now: number, maxSequenceBytes: number): AcceptContext => ({
      now,
      consumerId: 'consumer-a',
      leaseMs: 30_000,
      expiry: { ms: 60_000, strategy: 'fixed' },
      retentionMs: 60_000,
      limits: {
        maxSequenceBytes,
        maxFragments: 10,
        maxBufferedBytes: 1_000 * maxSequenceBytes,
        maxOpenSequences: 100,
      },
    });

    it('spreads sequences over the masters while each sequence stays in one slot', async () => {
      const store = await create();
      try {
        const names = new RedisKeys(prefixes.get(store)!);
        const scope = `cluster.${randomUUID()}`;
        const now = Date.now();
        const masters = new Set<string>();
        for (let index = 0; index < 12; index++) {
          const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
          await store.accept(fragments[0], acceptContext(now, 1_000));
          const keys = names.sequence(ref);
          masters.add(await slotOwner(await slotOf([keys.meta, keys.crc, keys.body])));
        }
        expect(masters.size).toBeGreaterThan(1);
        expect(await store.stats(now)).toMatchObject({
          openSequences: 12,
          bufferedBytes: 12 * storedChargeOf(1),
        });
      } finally {
        await close(store);
      }
    });

    it('stores large bodies outside Lua and reads them back in pieces, on every master', async () => {
      const prefix = uniquePrefix();
      const store = new RedisSequenceStore(cluster, { prefix, readPieceBytes: 64 * 1024 });
      prefixes.set(store, prefix);
      try {
        const names = new RedisKeys(prefix);
        const scope = `cluster.${randomUUID()}`;
        const now = Date.now();
        const masters = new Set<string>();
        // Sequence ids are random: go on until every master holds one (3 masters; 60 draws miss
        // one with a probability of about 1e-10), rather than hope 6 of them spread.
        for (let index = 0; index < 60 && masters.size < 3; index++) {
          const bodies = [300 * 1024 + index, 5, 70 * 1024].map((bytes) => randomBytes(bytes));
          const { fragments, ref } = sequenceFixture(scope, bodies);
          for (const fragment of fragments) {
            await store.accept(fragment, acceptContext(now, 1024 * 1024));
          }
          const read = Buffer.concat(await readAll(store.read(ref)));
          expect(read.equals(Buffer.concat(bodies))).toBe(true);
          masters.add(await slotOwner(await slotOf([names.sequence(ref).meta])));
        }
        expect(masters.size).toBe(3);
      } finally {
        await close(store);
      }
    });
  });

  describe('RedisPayloadStore', () => {
    const prefixes = new Map<PayloadStore, string>();

    async function create(): Promise<RedisPayloadStore> {
      const prefix = uniquePrefix();
      const store = new RedisPayloadStore(cluster, { prefix });
      prefixes.set(store, prefix);
      return store;
    }

    async function close(store: PayloadStore): Promise<void> {
      await store.close();
      const prefix = prefixes.get(store)!;
      prefixes.delete(store);
      await removeKeysUnder(prefix);
    }

    describePayloadStoreConformance('redis on Redis Cluster', { create, close });

    it('spreads payloads over the masters while each payload stays in one slot', async () => {
      const store = await create();
      try {
        const names = new RedisPayloadKeys(prefixes.get(store)!);
        const now = Date.now();
        const masters = new Set<string>();
        for (let index = 0; index < 12; index++) {
          const { ref } = await store.put(Buffer.alloc(3_000, index), {
            now,
            expiresAt: now + 60_000,
            published: false,
          });
          const keys = names.payload(ref);
          masters.add(await slotOwner(await slotOf([keys.meta, keys.chunk(0)])));
        }
        expect(masters.size).toBeGreaterThan(1);
      } finally {
        await close(store);
      }
    });
  });

  describe('RedisClaimLedger', () => {
    /** Prefix of each ledger the harness created; peers are not in it (they own a client). */
    const prefixes = new Map<ClaimLedger, string>();
    /** The client of each peer, which its close quits. */
    const peerClients = new Map<ClaimLedger, Cluster>();

    async function create(): Promise<RedisClaimLedger> {
      const prefix = uniquePrefix();
      const ledger = new RedisClaimLedger(cluster, { prefix });
      prefixes.set(ledger, prefix);
      return ledger;
    }

    // A second consumer instance: a cluster client of its own, the same keys.
    async function peer(ledger: ClaimLedger): Promise<ClaimLedger> {
      const client = connect();
      const other = new RedisClaimLedger(client, { prefix: prefixes.get(ledger)! });
      peerClients.set(other, client);
      return other;
    }

    async function close(ledger: ClaimLedger): Promise<void> {
      await ledger.close();
      const client = peerClients.get(ledger);
      if (client) {
        peerClients.delete(ledger);
        await client.quit().catch(() => client.disconnect());
        return;
      }
      const prefix = prefixes.get(ledger)!;
      prefixes.delete(ledger);
      await removeKeysUnder(prefix);
    }

    describeClaimLedgerConformance('redis on Redis Cluster', { create, peer, close });

    it("spreads tickets over the masters while each ticket's keys stay in one slot", async () => {
      const ledger = await create();
      try {
        const names = new RedisClaimKeys(prefixes.get(ledger)!);
        const now = Date.now();
        const masters = new Set<string>();
        for (let index = 0; index < 12; index++) {
          const orders = { ticket: `redis:${randomUUID()}`, group: 'orders.created' };
          const audit = { ...orders, group: 'audit' };
          await ledger.claim(orders, 'a', 30_000, now);
          await ledger.claim(audit, 'b', 30_000, now);
          await ledger.complete(orders, 'a', now + 60_000, now + 1);
          const keys = [names.of(orders).done, names.of(orders).lease, names.of(audit).lease];
          masters.add(await slotOwner(await slotOf(keys)));
        }
        expect(masters.size).toBeGreaterThan(1);
      } finally {
        await close(ledger);
      }
    });
  });

  describe('RedisResequencerStore', () => {
    /** Prefix of each store the harness created; peers are not in it (they own a client). */
    const prefixes = new Map<ResequencerStore, string>();
    /** The client of each peer, which its close quits. */
    const peerClients = new Map<ResequencerStore, Cluster>();

    describeResequencerStoreConformance('redis on Redis Cluster', {
      create: async () => {
        const prefix = uniquePrefix();
        const store = new RedisResequencerStore(cluster, { prefix });
        prefixes.set(store, prefix);
        return store;
      },
      // A second consumer instance: a cluster client of its own, the same keys.
      peer: async (store) => {
        const client = connect();
        const other = new RedisResequencerStore(client, { prefix: prefixes.get(store)! });
        peerClients.set(other, client);
        return other;
      },
      close: async (store) => {
        await store.close();
        const client = peerClients.get(store);
        if (client) {
          peerClients.delete(store);
          await client.quit().catch(() => client.disconnect());
          return;
        }
        const prefix = prefixes.get(store)!;
        prefixes.delete(store);
        await removeKeysUnder(prefix);
      },
    });

    it("takes a retired key out of its scope's index, which lives in another slot", async () => {
      const prefix = uniquePrefix();
      const store = new RedisResequencerStore(cluster, { prefix });
      const key = { scope: 'orders', key: 'order-1' };
      const entry = (seq: number) => ({ seq, body: Buffer.from([seq]), headers: {} });
      const context = {
        start: 1,
        limits: { maxBufferedPerKey: 10, maxBufferedTotal: 100 },
        now: Date.now(),
      };
      const drain = { holder: 'drainer', leaseMs: 30_000, limit: 10, now: context.now };
      // A gap, then filled: the key has a record in the index.
      await store.accept(key, entry(2), context);
      await store.accept(key, entry(1), context);
      await store.claimDrain(key, drain);
      await store.settleDrain(key, 2, drain);
      const records = new RedisResequencerKeys(prefix).index('orders').records;
      expect(await cluster.hget(records, 'order-1')).not.toBeNull();

      await expect(store.retire(key, 60_000, context.now)).resolves.toBe(true);
      expect(await cluster.hget(records, 'order-1')).toBeNull();

      // Another instance's index step from before the retirement (a closed key's stalled
      // hand-off), delayed until after it: the sweeper's claim finds the key empty and drops it.
      const day = 86_400_000;
      await loadScripts(cluster)['rsq-index'](
        indexKeyList(new RedisResequencerKeys(prefix).index('orders')),
        ['order-1', 1, 0, 3, -1, -1, 0, context.now, context.now, context.now, day, day, 10, 0],
      );
      const idle = context.now + 1;
      await expect(store.listStalledHandOffs('orders', idle, 10)).resolves.toEqual(['order-1']);
      await expect(store.claimDrain(key, { ...drain, now: idle })).resolves.toEqual({
        kind: 'empty',
      });
      await expect(store.listStalledHandOffs('orders', idle, 10)).resolves.toEqual([]);
      expect(await cluster.hget(records, 'order-1')).toBeNull();
      await removeKeysUnder(prefix);
    });

    it('retires a key even when its index step fails (the key expires all the same)', async () => {
      const prefix = uniquePrefix();
      const store = new RedisResequencerStore(cluster, { prefix });
      const key = { scope: 'orders', key: 'order-2' };
      const now = Date.now();
      await store.accept(
        key,
        { seq: 1, body: Buffer.from([1]), headers: {} },
        {
          start: 1,
          limits: { maxBufferedPerKey: 10, maxBufferedTotal: 100 },
          now,
        },
      );
      const drain = { holder: 'drainer', leaseMs: 30_000, limit: 10, now };
      await store.claimDrain(key, drain);
      await store.settleDrain(key, 1, drain);
      const { index } = store as unknown as { index: { unindex(): Promise<void> } };
      index.unindex = () => Promise.reject(new Error('CLUSTERDOWN'));

      await expect(store.retire(key, 60_000, now)).resolves.toBe(true);
      await removeKeysUnder(prefix);
    });
  });
});
