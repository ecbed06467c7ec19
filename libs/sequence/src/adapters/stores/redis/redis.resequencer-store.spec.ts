import calculateSlot from 'cluster-key-slot';
import { randomBytes, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { describeResequencerStoreConformance } from '../../../testing/conformance/resequencer-store.conformance';
import { deleteUnder, keysUnder, redisClient } from '../../../../test/support/redis.fixture';
import { SERVERS, describeWithServer } from '../../../../test/support/servers';
import {
  heldEntryBytes,
  type AcceptOutcome,
  type DrainSettlement,
  type AcceptContext,
  type ResequencedEntry,
  type ResequencerKey,
  type ResequencerStore,
} from '../../../ports/resequencer-store.port';
import { encodeEntry } from './redis-resequencer.codec';
import { indexKeyList, keyKeyList, RedisResequencerKeys } from './redis-resequencer-keys';
import { RedisResequencerStoreError } from './redis-resequencer-store.error';
import { loadScripts } from './redis-scripts';
import { RedisResequencerStore } from './redis.resequencer-store';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

const RETENTION_MS = 3_600_000;
const MARGIN_MS = 60_000;
const DRAIN = { holder: 'drainer', leaseMs: 30_000, limit: 100 };

const entry = (seq: number): ResequencedEntry => ({
  seq,
  body: Buffer.from([seq & 0xff, 0xff, 0x00, 0xfe]),
  headers: { 'x-resequence-seq': seq },
});

describeWithServer('redis', 'RedisResequencerStore (Redis at REDIS_URL)', () => {
  let redis: Redis;

  beforeAll(() => {
    redis = redisClient();
  });

  afterAll(async () => {
    await redis.quit();
  });

  describe('conformance', () => {
    /** Prefix of each store the harness created (peers are not in it: they own a client). */
    const prefixes = new Map<ResequencerStore, string>();

    const encryption = { keys: [{ id: 'conformance', key: randomBytes(32) }] };
    for (const [name, unsafeSocketTricks, encrypted] of [
      ['redis', false, false],
      ['redis (unsafeSocketTricks)', true, false],
      ['redis (encrypted)', false, true],
    ] as const) {
      describeResequencerStoreConformance(name, {
        create: async () => {
          const prefix = `nseq-test:${randomUUID()}`;
          const store = new RedisResequencerStore(redis, {
            prefix,
            unsafeSocketTricks,
            ...(encrypted && { encryption }),
          });
          prefixes.set(store, prefix);
          return store;
        },
        // A second consumer instance: its own connection, the same keys.
        peer: async (store) =>
          RedisResequencerStore.connect(SERVERS.redis.url, {
            prefix: prefixes.get(store)!,
            unsafeSocketTricks,
            ...(encrypted && { encryption }),
          }),
        close: async (store) => {
          await store.close();
          const prefix = prefixes.get(store);
          if (prefix === undefined) return;
          prefixes.delete(store);
          await deleteUnder(redis, prefix);
          expect(await keysUnder(redis, prefix)).toEqual([]);
        },
      });
    }
  });

  describe('RedisResequencerStore', () => {
    let prefix: string;
    let store: RedisResequencerStore;
    let names: RedisResequencerKeys;
    let key: ResequencerKey;
    let t0: number;
    let at: (now: number, limits?: Partial<AcceptContext['limits']>) => AcceptContext;

    beforeEach(() => {
      prefix = `nseq-test:${randomUUID()}`;
      store = new RedisResequencerStore(redis, {
        prefix,
        retentionMs: RETENTION_MS,
        keyTtlMarginMs: MARGIN_MS,
      });
      names = new RedisResequencerKeys(prefix);
      key = { scope: `orders.${randomUUID()}`, key: 'order-1' };
      t0 = Date.now();
      at = (now, limits = {}) => ({
        start: 1,
        now,
        limits: { maxBufferedPerKey: 100, maxBufferedTotal: 1_000, ...limits },
      });
    });

    afterEach(async () => {
      await store.close();
      await deleteUnder(redis, prefix);
    });

    describe('retire', () => {
      /** A key released, drained and with a gap in its past: it has a record in the index. */
      async function endedKey(): Promise<void> {
        await store.accept(key, entry(2), at(t0));
        await store.accept(key, entry(1), at(t0));
        await store.claimDrain(key, { ...DRAIN, now: t0 });
        await store.settleDrain(key, 2, { ...DRAIN, now: t0 });
      }
      const indexed = async () => ({
        record: await redis.hget(names.index(key.scope).records, key.key),
        activity: await redis.zscore(names.index(key.scope).activity, key.key),
      });

      it("shortens the key's TTL to about retainMs, and a change gives it the retention again", async () => {
        await endedKey();
        await expect(store.retire(key, 60_000, t0)).resolves.toBe(true);
        const ttl = await redis.pttl(names.of(key).state);
        expect(ttl).toBeGreaterThan(60_000 - 5_000);
        expect(ttl).toBeLessThanOrEqual(66_000);

        await store.accept(key, entry(4), at(t0 + 1));
        expect(await redis.pttl(names.of(key).state)).toBeGreaterThan(RETENTION_MS);
        expect(await redis.hget(names.of(key).state, 'retireAt')).toBeNull();
      });

      it('takes the key out of the index, and a claim that finds it empty does not put it back', async () => {
        await endedKey();
        expect((await indexed()).record).not.toBeNull();

        await expect(store.retire(key, 60_000, t0)).resolves.toBe(true);
        await expect(indexed()).resolves.toEqual({ record: null, activity: null });
        // A drainer that was waiting on the key (the sweeper's, a waiter's) finds nothing.
        await expect(store.claimDrain(key, { ...DRAIN, now: t0 + 1 })).resolves.toEqual({
          kind: 'empty',
        });
        await expect(indexed()).resolves.toEqual({ record: null, activity: null });
      });

      it('ends a retirement once the key changed, even by an instance that kept its fields', async () => {
        await endedKey();
        await expect(store.retire(key, 60_000, t0)).resolves.toBe(true);
        // Gone: the next change renews the TTLs, whatever instance makes it.
        expect(await redis.hget(names.of(key).state, 'ttlAt')).toBeNull();
        const state = await redis.hgetall(names.of(key).state);
        const retirement = Object.fromEntries(
          Object.entries(state).filter(([field]) => field.startsWith('retire')),
        );

        // A change by an instance that predates retirement: the retirement's fields stay.
        await store.accept(key, entry(4), at(t0 + 1));
        await redis.hset(names.of(key).state, retirement);
        // Past the retirement's end, the key (changed since) keeps what it holds.
        await expect(store.accept(key, entry(3), at(t0 + 60_000))).resolves.toEqual({
          kind: 'released',
          next: 5,
          count: 2,
        });
      });

      it('repairs index entries that a step it overtook put back, with the next claim or gap resolution', async () => {
        await endedKey();
        await expect(store.retire(key, 60_000, t0 + 1)).resolves.toBe(true);
        // Another instance's index step from before the retirement, delayed until after it.
        const scripts = loadScripts(redis);
        const ik = indexKeyList(names.index(key.scope));
        const staleStep = (gapSince: number, handOffAt: number) =>
          scripts['rsq-index'](ik, [
            key.key,
            1,
            0,
            3,
            -1,
            gapSince,
            0,
            handOffAt,
            t0,
            t0 + 2,
            RETENTION_MS,
            RETENTION_MS + MARGIN_MS,
            10,
            0,
          ]);

        // A stalled hand-off: the sweeper's claim finds the key empty, and drops the entries.
        await staleStep(-1, t0);
        await expect(store.listStalledHandOffs(key.scope, t0 + 10, 10)).resolves.toEqual([key.key]);
        await expect(store.claimDrain(key, { ...DRAIN, now: t0 + 10 })).resolves.toEqual({
          kind: 'empty',
        });
        await expect(store.listStalledHandOffs(key.scope, t0 + 10, 10)).resolves.toEqual([]);
        await expect(indexed()).resolves.toEqual({ record: null, activity: null });

        // A gap: the sweeper's resolution finds none, and drops the entries.
        await staleStep(t0, -1);
        await expect(store.listGaps(key.scope, t0 + 10, 10)).resolves.toHaveLength(1);
        await expect(
          store.resolveGap(key, 'dead-letter', { openedBefore: t0 + 10, now: t0 + 10 }),
        ).resolves.toEqual({ kind: 'none' });
        await expect(store.listGaps(key.scope, t0 + 10, 10)).resolves.toEqual([]);
        await expect(indexed()).resolves.toEqual({ record: null, activity: null });
      });

      it('leaves the index record of a change newer than the one it retired', async () => {
        await endedKey();
        const ver = Number((await redis.hget(names.of(key).state, 'ver'))!);
        // A change of the key indexed after the retirement was decided (another instance's).
        await store.accept(key, entry(5), at(t0 + 1));
        const newer = await redis.hget(names.index(key.scope).records, key.key);

        const scripts = loadScripts(redis);
        await scripts['rsq-unindex'](indexKeyList(names.index(key.scope)), [key.key, ver]);
        expect(await redis.hget(names.index(key.scope).records, key.key)).toBe(newer);
        await scripts['rsq-unindex'](indexKeyList(names.index(key.scope)), [key.key, ver + 1e6]);
        await expect(indexed()).resolves.toEqual({ record: null, activity: null });
      });
    });

    it('gives every key it writes a TTL: retentionMs, plus the margin for the index', async () => {
      await store.accept(key, entry(3), at(t0));
      await store.accept(key, entry(1), at(t0));
      await store.resolveGap(key, 'alert', { openedBefore: t0, now: t0 });
      await store.claimDrain(key, { ...DRAIN, now: t0 });
      await store.settleDrain(key, 1, { ...DRAIN, now: t0 });
      const waiting = { ...key, key: 'order-2' };
      await store.accept(waiting, entry(2), at(t0));

      const perKey = [
        ...keyKeyList(names.of(key)),
        names.of(waiting).state,
        names.of(waiting).buffer,
      ];
      const index = indexKeyList(names.index(key.scope));
      const written = await keysUnder(redis, prefix);
      expect(written.sort()).toEqual([...perKey, ...index].sort());
      // Set for retentionMs * 1.1 and renewed once retentionMs / 10 has passed: a key's keys
      // always outlive its last change by retentionMs.
      for (const name of perKey) {
        const ttl = await redis.pttl(name);
        expect(ttl).toBeLessThanOrEqual(RETENTION_MS * 1.1);
        expect(ttl).toBeGreaterThan(RETENTION_MS);
      }
      // The index keys likewise, by the margin more: set for (retentionMs + margin) * 1.1.
      for (const name of index) {
        const ttl = await redis.pttl(name);
        expect(ttl).toBeLessThanOrEqual((RETENTION_MS + MARGIN_MS) * 1.1);
        expect(ttl).toBeGreaterThan(RETENTION_MS + MARGIN_MS);
      }
    });

    it('gives an index key that a step creates again its TTL at once', async () => {
      const gaps = names.index(key.scope).gaps;
      await store.accept(key, entry(2), at(t0));
      expect(await redis.exists(gaps)).toBe(1);
      // The gap closes: its sorted set empties, and Redis deletes it.
      await store.accept(key, entry(1), at(t0));
      expect(await redis.exists(gaps)).toBe(0);
      // A new gap (4 waits for 3) creates it again, while the other index keys' TTLs are fresh.
      await store.accept(key, entry(4), at(t0 + 1));
      const ttl = await redis.pttl(gaps);
      expect(ttl).toBeGreaterThan(RETENTION_MS + MARGIN_MS);
      expect(ttl).toBeLessThanOrEqual((RETENTION_MS + MARGIN_MS) * 1.1);
    });

    describe('accepts made in one turn of the event loop (one Redis node)', () => {
      const events: Array<[string, number]> = [
        ['order-1', 2],
        ['order-2', 1],
        ['order-1', 1],
        ['order-3', 3],
        ['order-1', 3],
        ['order-2', 1],
        ['order-1', 5],
      ];

      /** How many scripts `client` ran while `work` did. */
      async function scriptCalls(client: Redis, work: () => Promise<unknown>): Promise<number> {
        let calls = 0;
        const send = client.sendCommand.bind(client);
        const spy = jest.spyOn(client, 'sendCommand').mockImplementation((command, stream) => {
          if (/^eval/i.test(command.name)) calls++;
          return send(command, stream);
        });
        try {
          await work();
        } finally {
          spy.mockRestore();
        }
        return calls;
      }

      it('runs them in one script call, each answered as when it comes alone', async () => {
        const drain = { ...DRAIN, now: t0 };
        const context = { ...at(t0), drain };
        const alone = [];
        for (const [name, seq] of events) {
          alone.push(await store.accept({ ...key, key: name }, entry(seq), context));
        }

        const client = redisClient();
        const batched = new RedisResequencerStore(client, { prefix, retentionMs: RETENTION_MS });
        const scope = `${key.scope}.batched`;
        try {
          await batched.bufferedTotal(scope); // the totals `accept` checks, read now
          let outcomes: unknown[] = [];
          const calls = await scriptCalls(client, async () => {
            outcomes = await Promise.all(
              events.map(([name, seq]) =>
                batched.accept({ scope, key: name }, entry(seq), context),
              ),
            );
          });
          expect(calls).toBe(1);
          expect(outcomes).toEqual(alone);
          expect(await batched.bufferedTotal(scope)).toBe(await store.bufferedTotal(key.scope));
          expect(await batched.inspect({ scope, key: 'order-1' }, 1)).toEqual(
            await store.inspect({ ...key, key: 'order-1' }, 1),
          );
          expect(await batched.listGaps(scope, t0 + 1, 10)).toEqual(
            await store.listGaps(key.scope, t0 + 1, 10),
          );
        } finally {
          await client.quit();
        }
      });

      it('settles the drains of one turn in one script call, each as when it comes alone', async () => {
        const drain = { ...DRAIN, limit: 2, now: t0 };
        const context = { ...at(t0), drain };
        const client = redisClient();
        const batched = new RedisResequencerStore(client, { prefix, retentionMs: RETENTION_MS });
        const scope = `${key.scope}.batched`;
        const settles: Array<[string, number]> = [
          ['order-1', 2],
          ['order-2', 1],
          ['order-1', 1],
          ['order-3', 1],
        ];
        try {
          for (const [target, name] of [
            [store, key.scope],
            [batched, scope],
          ] as const) {
            for (const seq of [1, 2, 3, 4]) {
              await target.accept({ scope: name, key: 'order-1' }, entry(seq), context);
            }
            await target.accept({ scope: name, key: 'order-2' }, entry(1), context);
          }
          const alone = [];
          for (const [name, count] of settles) {
            alone.push(await store.settleDrain({ ...key, key: name }, count, drain));
          }
          let outcomes: unknown[] = [];
          const calls = await scriptCalls(client, async () => {
            outcomes = await Promise.all(
              settles.map(([name, count]) =>
                batched.settleDrain({ scope, key: name }, count, drain),
              ),
            );
          });
          expect(calls).toBe(1);
          expect(outcomes).toEqual(alone);
          expect(outcomes.map((outcome) => (outcome as DrainSettlement).kind)).toEqual([
            'claimed',
            'empty',
            'claimed',
            'lost',
          ]);
        } finally {
          await client.quit();
        }
      });

      it('writes the scope totals once per call, exactly, when it replaces and prunes expired records', async () => {
        const client = redisClient();
        const batched = new RedisResequencerStore(client, { prefix, retentionMs: RETENTION_MS });
        const ref = (name: string) => ({ ...key, key: name });
        try {
          await batched.accept(ref('a'), entry(5), at(t0));
          await batched.accept(ref('b'), entry(7), at(t0));
          const later = t0 + RETENTION_MS;
          await batched.bufferedTotal(key.scope);
          // One call: a comes back past its retention (its record replaced), c enters the index
          // (b's expired record is pruned) and buffers twice.
          let outcomes: AcceptOutcome[] = [];
          const calls = await scriptCalls(client, async () => {
            outcomes = await Promise.all([
              batched.accept(ref('a'), entry(3), at(later)),
              batched.accept(ref('c'), entry(2), at(later)),
              batched.accept(ref('c'), entry(4), at(later)),
            ]);
          });
          expect(calls).toBe(1);
          expect(outcomes.map((outcome) => outcome.kind)).toEqual([
            'buffered',
            'buffered',
            'buffered',
          ]);
          const held = async (name: string) => (await batched.inspect(ref(name), 1)).heldBytes ?? 0;
          await expect(batched.bufferedTotal(key.scope)).resolves.toBe(3);
          await expect(batched.bufferedBytes(key.scope)).resolves.toBe(
            (await held('a')) + (await held('c')),
          );
          const gaps = await batched.listGaps(key.scope, later + 1, 10);
          expect(gaps.map((gap) => gap.key).sort()).toEqual(['a', 'c']);
        } finally {
          await client.quit();
        }
      });

      it('keeps the totals of the events a failing call took before the failure', async () => {
        const broken = { ...key, key: 'broken' };
        await redis.set(names.of(broken).state, 'not a hash');
        await store.bufferedTotal(key.scope);
        const [first, failed] = await Promise.allSettled([
          store.accept(key, entry(4), at(t0)),
          store.accept(broken, entry(1), at(t0)),
        ]);
        // Buffered by the call that failed; alone, it comes back as the duplicate it is.
        expect(first).toEqual({
          status: 'fulfilled',
          value: { kind: 'duplicate', next: 1 },
        });
        expect(failed).toMatchObject({ status: 'rejected' });
        await expect(store.bufferedTotal(key.scope)).resolves.toBe(1);
        await expect(store.bufferedBytes(key.scope)).resolves.toBe(
          (await store.inspect(key, 1)).heldBytes ?? 0,
        );
      });

      it('answers each on its own when the call for them all fails', async () => {
        const broken = { ...key, key: 'broken' };
        // Not a hash: the script fails on this key (WRONGTYPE) after taking the events before it.
        await redis.set(names.of(broken).state, 'not a hash');
        await store.bufferedTotal(key.scope);
        const [first, failed, last] = await Promise.allSettled([
          store.accept(key, entry(1), at(t0)),
          store.accept(broken, entry(1), at(t0)),
          store.accept({ ...key, key: 'order-2' }, entry(2), at(t0)),
        ]);
        // Taken by the call that failed: alone, it comes back as a redelivery would, late.
        expect(first).toEqual({
          status: 'fulfilled',
          value: { kind: 'late', next: 2, pending: true },
        });
        expect(failed).toMatchObject({ status: 'rejected' });
        expect(last).toEqual({
          status: 'fulfilled',
          value: { kind: 'buffered', next: 1, buffered: 1 },
        });
        expect((await store.inspect(key, 1)).next).toBe(2);
      });
    });

    it('lets Redis drop every key in real time once retention and margin have passed', async () => {
      const short = new RedisResequencerStore(redis, {
        prefix,
        retentionMs: 100,
        keyTtlMarginMs: 0,
      });
      await short.accept(key, entry(2), at(Date.now()));
      await short.accept(key, entry(1), at(Date.now()));
      expect((await keysUnder(redis, prefix)).length).toBeGreaterThan(0);

      await sleep(300);

      expect(await keysUnder(redis, prefix)).toEqual([]);
    });

    it('forgets a key whose last change is retentionMs old by the callers’ clock', async () => {
      await store.accept(key, entry(5), at(t0));
      const later = t0 + RETENTION_MS;

      await expect(store.accept(key, entry(1), at(later))).resolves.toEqual({
        kind: 'released',
        next: 2,
        count: 1,
      });
      await expect(store.inspect(key, 1)).resolves.toMatchObject({ next: 2, buffered: [] });
      await expect(store.bufferedTotal(key.scope)).resolves.toBe(0);
      await expect(store.listGaps(key.scope, later, 10)).resolves.toEqual([]);
    });

    it('prunes expired keys from the index when another key of the scope changes', async () => {
      await store.accept(key, entry(5), at(t0));
      const other = { ...key, key: 'order-2' };

      await store.accept(other, entry(3), at(t0 + RETENTION_MS));

      await expect(store.bufferedTotal(key.scope)).resolves.toBe(1);
      const gaps = await store.listGaps(key.scope, t0 + RETENTION_MS, 10);
      expect(gaps.map((gap) => gap.key)).toEqual(['order-2']);
    });

    it('counts no gap of a key past its retention in gapStats, though nothing pruned it yet', async () => {
      await store.accept(key, entry(5), at(t0));
      await store.accept({ ...key, key: 'order-2' }, entry(3), at(t0 + 10));
      await expect(store.gapStats(key.scope, t0 + 100)).resolves.toEqual({
        openGaps: 2,
        oldestGapAgeMs: 100,
      });

      await expect(store.gapStats(key.scope, t0 + RETENTION_MS + 5)).resolves.toEqual({
        openGaps: 1,
        oldestGapAgeMs: RETENTION_MS - 5,
      });
    });

    it('frees the room of expired keys for maxBufferedTotal before refusing an event', async () => {
      await store.accept(key, entry(2), at(t0, { maxBufferedTotal: 1 }));
      const later = t0 + RETENTION_MS;

      await expect(
        store.accept({ ...key, key: 'order-2' }, entry(2), at(later, { maxBufferedTotal: 1 })),
      ).resolves.toEqual({ kind: 'buffered', next: 1, buffered: 1 });
      await expect(store.bufferedTotal(key.scope)).resolves.toBe(1);
      // A key that has not expired still counts, by a prune of its own (one per 100 ms per scope).
      await new Promise((resolve) => setTimeout(resolve, 150));
      await expect(
        store.accept({ ...key, key: 'order-3' }, entry(2), at(later, { maxBufferedTotal: 1 })),
      ).resolves.toEqual({ kind: 'full', next: 1, limit: 'maxBufferedTotal' });
    });

    describe('gaps close to retention', () => {
      const IDLE_MS = RETENTION_MS - RETENTION_MS / 10;

      it('finds an idle key behind a thousand keys whose older gaps still change', async () => {
        const roomy = { maxBufferedTotal: 10_000 };
        for (let i = 0; i < 1_000; i++) {
          await store.accept({ ...key, key: `busy-${i}` }, entry(3), at(t0, roomy));
        }
        await store.accept({ ...key, key: 'idle' }, entry(3), at(t0 + 1, roomy));
        for (let i = 0; i < 1_000; i++) {
          const accepted = store.accept(
            { ...key, key: `busy-${i}` },
            entry(4),
            at(t0 + IDLE_MS, roomy),
          );
          await expect(accepted).resolves.toMatchObject({ kind: 'buffered' });
        }

        const gaps = await store.listExpiringGaps(key.scope, t0 + 1 + IDLE_MS, 10);
        expect(gaps.map((gap) => gap.key)).toEqual(['idle']);
      });

      it('lists a key anew once a settle moved it after its last index step, and resolves it then', async () => {
        await store.accept(key, entry(1), at(t0));
        await store.accept(key, entry(3), at(t0 + 1));
        await store.claimDrain(key, { ...DRAIN, now: t0 + 2 });
        await store.settleDrain(key, 1, { ...DRAIN, now: t0 + 2 });
        const now = t0 + 2 + IDLE_MS;

        // The settle changed the key's state without an index step: the listing is stale and
        // the resolution refused, which brings the index up to date.
        const [stale] = await store.listExpiringGaps(key.scope, now, 10);
        expect(stale.changedAt).toBe(t0 + 1);
        const refused = { openedBefore: now, now, unchangedSince: stale.changedAt };
        await expect(store.resolveGap(key, 'dead-letter', refused)).resolves.toEqual({
          kind: 'none',
        });
        const [fresh] = await store.listExpiringGaps(key.scope, now, 10);
        expect(fresh.changedAt).toBe(t0 + 2);
        const resolved = { openedBefore: now, now, unchangedSince: fresh.changedAt };
        await expect(store.resolveGap(key, 'dead-letter', resolved)).resolves.toMatchObject({
          kind: 'resolved',
          appended: 1,
        });
      });
    });

    it('lets refusals that arrive together share one prune, and each ask again with the total it left', async () => {
      for (const name of ['a', 'b', 'c']) {
        await store.accept({ ...key, key: name }, entry(2), at(t0, { maxBufferedTotal: 3 }));
      }
      const later = t0 + RETENTION_MS;
      const accepts = ['d', 'e', 'f', 'g'].map((name) =>
        store.accept({ ...key, key: name }, entry(2), at(later, { maxBufferedTotal: 3 })),
      );

      // None is refused for the room the expired keys held. Each asked again with the total the
      // shared prune left (0); asked in one turn, on one node, they went in one call, where each
      // is checked against the total the ones before it left: the last finds the bound reached.
      // (Accepts of other turns or instances within TOTAL_MAX_AGE_MS may overshoot it: see the
      // top of redis.resequencer-store.ts.)
      const outcomes = (await Promise.all(accepts)).map((outcome) => outcome.kind);
      expect(outcomes).toEqual(['buffered', 'buffered', 'buffered', 'full']);
      await expect(store.bufferedTotal(key.scope)).resolves.toBe(3);
    });

    it('keeps an alerted gap in the gaps index at gapSince + 2^50, exactly, out of every due range', async () => {
      await store.accept(key, entry(3), at(t0));
      await store.resolveGap(key, 'alert', { openedBefore: t0, now: t0 + 1 });

      const gapsKey = names.index(key.scope).gaps;
      await expect(redis.zscore(gapsKey, key.key)).resolves.toBe(String(t0 + 2 ** 50));
      await expect(store.listGaps(key.scope, Number.MAX_SAFE_INTEGER, 10)).resolves.toEqual([]);
      await expect(store.listGaps(key.scope, t0, 10, true)).resolves.toMatchObject([
        { key: key.key, gapSince: t0, alerted: true },
      ]);
    });

    it('trims a settled batch once when the client sends the settle twice (a resend after a reconnect)', async () => {
      for (const seq of [1, 2, 3, 4, 5, 6]) await store.accept(key, entry(seq), at(t0));
      const drain = { ...DRAIN, limit: 3, now: t0 };
      await expect(store.claimDrain(key, drain)).resolves.toMatchObject({ kind: 'claimed' });
      // What ioredis does with a command whose reply a dropped connection lost: it sends it again.
      const scripts = (
        store as unknown as { scripts: Record<string, (...a: unknown[]) => unknown> }
      ).scripts;
      for (const name of ['rsq-settle', 'rsq-settle-ix']) {
        const once = scripts[name];
        scripts[name] = async (...args: unknown[]) => {
          await once(...args);
          return once(...args);
        };
      }

      const settled = await store.settleDrain(key, 3, drain);

      expect(settled).toMatchObject({ kind: 'claimed' });
      const seqs = settled.kind === 'claimed' ? settled.items : [];
      expect(seqs.map((item) => ('entry' in item ? item.entry.seq : undefined))).toEqual([4, 5, 6]);
      await expect(store.inspect(key, 1)).resolves.toMatchObject({ handOff: 3 });
    });

    it('counts an entry stored before byte budgets by its stored length, and never below zero', async () => {
      // What a previous version wrote: entries without their counted bytes ("n"), in a key
      // whose state counts no bytes for them.
      const legacy = (seq: number) =>
        JSON.stringify({ s: seq, h: {}, b: Buffer.from(`old-${seq}`).toString('base64') });
      await store.accept(key, entry(1), at(t0));
      await redis.rpush(names.of(key).handOff, `e${legacy(2)}`);
      await redis.hset(names.of(key).state, 'next', 3);
      await store.accept(key, entry(5), at(t0));
      await redis.zadd(names.of(key).buffer, 4, legacy(4));
      await expect(store.inspect(key, 1)).resolves.toMatchObject({
        heldBytes: heldEntryBytes(entry(1)) + heldEntryBytes(entry(5)),
      });

      // Settling 1 and the legacy 2 takes more than the state counted: it stops at zero.
      await store.claimDrain(key, { ...DRAIN, now: t0 });
      await store.settleDrain(key, 2, { ...DRAIN, now: t0 });
      await expect(store.inspect(key, 1)).resolves.toMatchObject({
        heldBytes: heldEntryBytes(entry(5)),
      });

      // 3 releases the legacy 4 (counted by its stored length) and 5; then all drain to zero.
      await store.accept(key, entry(3), at(t0 + 1));
      await expect(store.inspect(key, 1)).resolves.toMatchObject({
        handOff: 3,
        heldBytes: heldEntryBytes(entry(3)) + legacy(4).length + heldEntryBytes(entry(5)),
      });
      const drained = await store.claimDrain(key, { ...DRAIN, now: t0 + 2 });
      expect(drained.kind === 'claimed' && drained.items.length).toBe(3);
      await store.settleDrain(key, 3, { ...DRAIN, now: t0 + 2 });
      const state = await store.inspect(key, 1);
      expect(state).toEqual({ next: 6, buffered: [], handOff: 0 });
      await expect(store.bufferedBytes(key.scope)).resolves.toBe(0);
    });

    describe('a key whose Redis keys are partly gone (evicted, or a partial restore)', () => {
      it('drops the gap of a key whose state is gone, and its share of the buffered total', async () => {
        await store.accept(key, entry(3), at(t0));
        await store.accept(key, entry(4), at(t0 + 1));
        expect(await store.bufferedTotal(key.scope)).toBe(2);
        await redis.del(names.of(key).state);

        await expect(
          store.resolveGap(key, 'skip', { openedBefore: t0 + 10, now: t0 + 5_000 }),
        ).resolves.toEqual({ kind: 'none' });

        // Not listed again at every sweep, ahead of the live keys, until retention.
        await expect(store.listGaps(key.scope, t0 + 10, 10, true)).resolves.toEqual([]);
        await expect(store.bufferedTotal(key.scope)).resolves.toBe(0);
        await expect(store.gapStats(key.scope, t0 + 5_000)).resolves.toMatchObject({
          openGaps: 0,
        });
      });

      it('stops listing as stalled a hand-off whose list is gone', async () => {
        await store.accept(key, entry(3), at(t0));
        await expect(
          store.resolveGap(key, 'skip', { openedBefore: t0 + 10, now: t0 + 10 }),
        ).resolves.toMatchObject({ kind: 'resolved' });
        await redis.del(names.of(key).handOff);
        await expect(store.listStalledHandOffs(key.scope, t0 + 1_000, 10)).resolves.toEqual([
          key.key,
        ]);

        await expect(store.claimDrain(key, { ...DRAIN, now: t0 + 1_000 })).resolves.toEqual({
          kind: 'empty',
        });

        await expect(store.listStalledHandOffs(key.scope, t0 + 2_000, 10)).resolves.toEqual([]);
      });
    });

    it('does not reuse a buffer or hand-off list left from a previous life of the key', async () => {
      // Left behind when the state expired first (their TTLs were set when they were created).
      await redis.zadd(names.of(key).buffer, 2, encodeEntry(entry(2)));
      await redis.rpush(names.of(key).handOff, `e${encodeEntry(entry(9))}`);

      await expect(store.accept(key, entry(1), at(t0))).resolves.toMatchObject({
        kind: 'released',
        next: 2,
        count: 1,
      });
      await expect(store.inspect(key, 1)).resolves.toEqual({
        next: 2,
        buffered: [],
        handOff: 1,
        heldBytes: heldEntryBytes(entry(1)),
      });
    });

    describe('the two-step index', () => {
      it('heals after a crash between the per-key step and the index step', async () => {
        // The per-key step alone, as an instance that died before the index step leaves it.
        await loadScripts(redis)['rsq-accept'](keyKeyList(names.of(key)), [
          t0,
          1,
          4,
          encodeEntry(entry(4)),
          100,
          1_000,
          0,
          RETENTION_MS,
        ]);
        await expect(store.listGaps(key.scope, t0, 10)).resolves.toEqual([]);
        await expect(store.bufferedTotal(key.scope)).resolves.toBe(0);

        // The redelivered message is a duplicate now, and repairs the index.
        await expect(store.accept(key, entry(4), at(t0 + 1))).resolves.toEqual({
          kind: 'duplicate',
          next: 1,
        });

        await expect(store.listGaps(key.scope, t0, 10)).resolves.toEqual([
          { key: key.key, expected: 1, buffered: 1, lowest: 4, gapSince: t0, alerted: false },
        ]);
        await expect(store.bufferedTotal(key.scope)).resolves.toBe(1);
      });

      it('repairs a stale stalled entry when a claim finds the hand-off list empty', async () => {
        // A record saying the key has a tracked hand-off, whose emptying step was lost.
        await loadScripts(redis)['rsq-index'](indexKeyList(names.index(key.scope)), [
          ...[key.key, t0, 0, 2, -1, -1, 0, t0, t0],
          ...[t0, RETENTION_MS, RETENTION_MS + MARGIN_MS, 100],
        ]);
        await store.accept(key, entry(1), at(t0));
        await drainAllOf(store, key, t0 + 1);
        await expect(store.listStalledHandOffs(key.scope, t0 + 5, 10)).resolves.toEqual([key.key]);

        await expect(store.claimDrain(key, { ...DRAIN, now: t0 + 10 })).resolves.toEqual({
          kind: 'empty',
        });

        await expect(store.listStalledHandOffs(key.scope, t0 + 5, 10)).resolves.toEqual([]);
      });

      it('ignores a record older than the one it applied (instances finishing out of order)', async () => {
        const accept = (seq: number) =>
          loadScripts(redis)['rsq-accept'](keyKeyList(names.of(key)), [
            t0,
            1,
            seq,
            encodeEntry(entry(seq)),
            100,
            1_000,
            0,
            RETENTION_MS,
          ]);
        const older = (await accept(3)) as unknown[];
        const newer = (await accept(1)) as unknown[];
        const index = (record: unknown) => {
          const [ver, buffered, next, lowest, gapSince, alerted, handOffAt, at] =
            record as number[];
          return loadScripts(redis)['rsq-index'](indexKeyList(names.index(key.scope)), [
            ...[key.key, ver, buffered, next, lowest, gapSince, alerted, handOffAt, at],
            ...[t0, RETENTION_MS, RETENTION_MS + MARGIN_MS, 100],
          ]);
        };

        await index(newer[1]);
        await index(older[1]);

        await expect(store.bufferedTotal(key.scope)).resolves.toBe(1);
        const [gap] = await store.listGaps(key.scope, t0, 10);
        expect(gap).toMatchObject({ expected: 2, lowest: 3, buffered: 1 });
      });
    });

    it('checks maxBufferedTotal against what other instances buffered', async () => {
      const peer = RedisResequencerStore.connect(SERVERS.redis.url, { prefix });
      try {
        await store.accept(key, entry(3), at(t0, { maxBufferedTotal: 2 }));
        await store.accept({ ...key, key: 'order-2' }, entry(3), at(t0, { maxBufferedTotal: 2 }));

        await expect(
          peer.accept({ ...key, key: 'order-3' }, entry(3), at(t0, { maxBufferedTotal: 2 })),
        ).resolves.toEqual({ kind: 'full', next: 1, limit: 'maxBufferedTotal' });
      } finally {
        await peer.close();
      }
    });

    describe('hostile scopes and keys', () => {
      const scopes = ['a', 'a:b', '{a}', '}{', 'a%3Ab', '%', 'rsq-idx:a'];
      const keys = ['b', 'b:c', '{b}', '}', 'x{y}z', '%7B'];

      it('keeps the keys of one resequencer key in one cluster slot, and each scope index in one', async () => {
        for (const scope of scopes) {
          for (const name of keys) await store.accept({ scope, key: name }, entry(2), at(t0));
        }

        for (const scope of scopes) {
          const index = indexKeyList(names.index(scope));
          expect(calculateSlot.generateMulti(index)).toBeGreaterThanOrEqual(0);
          for (const name of keys) {
            const own = keyKeyList(names.of({ scope, key: name }));
            expect(calculateSlot.generateMulti(own)).toBe(
              calculateSlot(names.tagOf({ scope, key: name })),
            );
          }
        }
      });

      it('keeps keys apart whose names differ only in escaped characters', async () => {
        for (const scope of scopes) {
          for (const name of keys) await store.accept({ scope, key: name }, entry(2), at(t0));
        }

        const stored = (await keysUnder(redis, prefix)).filter((name) => name.endsWith(':state'));
        expect(stored).toHaveLength(scopes.length * keys.length);
        for (const scope of scopes) {
          await expect(store.bufferedTotal(scope)).resolves.toBe(keys.length);
          const gaps = await store.listGaps(scope, t0, 100);
          expect(gaps.map((gap) => gap.key).sort()).toEqual([...keys].sort());
        }
      });
    });

    describe('typed errors', () => {
      it('raises RedisResequencerStoreError for a corrupt hand-off item, and leaves it in place', async () => {
        await store.accept(key, entry(1), at(t0));
        await redis.rpush(names.of(key).handOff, 'e{"s":2,"h":{},"b":"not base64!"}');

        const claim = store.claimDrain(key, { ...DRAIN, now: t0 });

        await expect(claim).rejects.toThrow(RedisResequencerStoreError);
        await expect(claim).rejects.toThrow(/hand-off list holds an entry without a base64 body/);
        await expect(redis.llen(names.of(key).handOff)).resolves.toBe(2);
      });

      it('raises RedisResequencerStoreError for a script reply it does not understand', async () => {
        const client = redisClient();
        try {
          jest.spyOn(loadScripts(client), 'rsq-accept-ix').mockResolvedValue(['queued', [], 1]);
          const confused = new RedisResequencerStore(client, { prefix });

          const accepted = confused.accept(key, entry(1), at(t0));

          await expect(accepted).rejects.toThrow(RedisResequencerStoreError);
          await expect(accepted).rejects.toMatchObject({
            code: 'redis-resequencer-store',
            operation: 'accept',
            scope: key.scope,
            key: key.key,
          });
        } finally {
          await client.quit();
        }
      });

      it('refuses a header value that could not come back with its type', async () => {
        const bad = { ...entry(1), headers: { weight: Number.NaN } };

        await expect(store.accept(key, bad, at(t0))).rejects.toThrow(RangeError);
        await expect(keysUnder(redis, prefix)).resolves.toEqual([]);
      });
    });

    it('rejects a prefix with braces, a negative keyTtlMarginMs, an unsafeSocketTricks not a boolean', () => {
      expect(() => new RedisResequencerStore(redis, { prefix: 'nseq{x}' })).toThrow(/\{ or \}/);
      expect(() => new RedisResequencerStore(redis, { prefix, keyTtlMarginMs: -1 })).toThrow(
        SequenceOptionsError,
      );
      expect(
        () => new RedisResequencerStore(redis, { prefix, unsafeSocketTricks: 'yes' as never }),
      ).toThrow(/unsafeSocketTricks must be true or false/);
    });

    it('connects a client of its own and quits it on close; a client passed in stays open', async () => {
      const own = RedisResequencerStore.connect(SERVERS.redis.url, { prefix });
      await expect(own.accept(key, entry(2), at(t0))).resolves.toMatchObject({ kind: 'buffered' });

      await own.close();
      await store.close();

      await expect(own.ping()).rejects.toThrow();
      await expect(store.inspect(key, 1)).resolves.toMatchObject({ buffered: [2] });
    });

    it('rejects ping when Redis cannot be reached', async () => {
      const unreachable = RedisResequencerStore.connect('redis://127.0.0.1:1', {
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

/** Claims and settles everything in the key's hand-off list. */
async function drainAllOf(store: RedisResequencerStore, key: ResequencerKey, now: number) {
  const context = { holder: 'drain-all', leaseMs: 30_000, limit: 100, now };
  let claim: DrainSettlement = await store.claimDrain(key, context);
  while (claim.kind === 'claimed')
    claim = await store.settleDrain(key, claim.items.length, context);
}
