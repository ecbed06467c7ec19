import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { sequenceFixture } from '../../../testing/conformance/sequence-store.conformance';
import { SERVERS, describeWithServer } from '../../../../test/support/servers';
import { deleteUnder, redisClient } from '../../../../test/support/redis.fixture';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import type { AcceptContext } from '../../../ports/sequence-store.port';
import type { ResequencedEntry, ResequencerKey } from '../../../ports/resequencer-store.port';
import { RedisClaimLedger } from './redis.claim-ledger';
import { RedisResequencerStore } from './redis.resequencer-store';
import { RedisSequenceStore } from './redis.sequence-store';

/**
 * Two consumer instances share one Redis; one machine's clock is a minute off. Each instance
 * reads `now` from its own clock, as a real one would: the skewed instance's store is given the
 * same skewed clock its callers read. Leases and deadlines must run on Redis's clock.
 */
const SKEW_MS = 60_000;
const ahead = () => Date.now() + SKEW_MS;
const behind = () => Date.now() - SKEW_MS;

const LEASE_MS = 30_000;
const EXPIRY_MS = 30_000;
const RETENTION_MS = 3_600_000;

describeWithServer('redis', 'Redis stores with a skewed clock (Redis at REDIS_URL)', () => {
  let redis: Redis;
  let prefix: string;

  beforeAll(() => {
    redis = redisClient();
  });

  afterAll(async () => {
    await redis.quit();
  });

  beforeEach(() => {
    prefix = `nseq-test:${randomUUID()}`;
  });

  afterEach(async () => {
    await deleteUnder(redis, prefix);
  });

  describe('RedisSequenceStore', () => {
    const scope = 'clocks';
    const opened: RedisSequenceStore[] = [];

    /** An instance of its own connection, on a machine whose clock is `clock`. */
    function instance(clock: () => number): RedisSequenceStore {
      const store = RedisSequenceStore.connect(SERVERS.redis.url, { prefix, clock });
      opened.push(store);
      return store;
    }

    afterEach(async () => {
      for (const store of opened.splice(0)) await store.close();
    });

    function context(consumerId: string, now: number): AcceptContext {
      return {
        now,
        consumerId,
        leaseMs: LEASE_MS,
        expiry: { ms: EXPIRY_MS, strategy: 'fixed' },
        retentionMs: RETENTION_MS,
        limits: {
          maxSequenceBytes: 1024,
          maxFragments: 16,
          maxOpenSequences: 100,
          maxBufferedBytes: 1 << 20,
        },
      };
    }

    it('an instance whose clock runs ahead cannot take over the completion lease of another', async () => {
      const onTime = instance(Date.now);
      const early = instance(ahead);
      const { fragments } = sequenceFixture(scope, ['a', 'b']);
      await onTime.accept(fragments[0], context('on-time', Date.now()));
      expect(await onTime.accept(fragments[1], context('on-time', Date.now()))).toMatchObject({
        status: 'complete',
      });

      // The broker redelivers a fragment to the other instance while the handler runs.
      expect(await early.accept(fragments[1], context('early', ahead()))).toEqual({
        status: 'in-progress',
      });
    });

    it('an instance whose clock runs behind holds its completion lease on Redis time', async () => {
      const late = instance(behind);
      const onTime = instance(Date.now);
      const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
      await late.accept(fragments[0], context('late', behind()));
      expect(await late.accept(fragments[1], context('late', behind()))).toMatchObject({
        status: 'complete',
      });

      expect(await onTime.accept(fragments[1], context('on-time', Date.now()))).toEqual({
        status: 'in-progress',
      });
      expect(await late.renewLease(ref, 'late', LEASE_MS, behind())).toBe(true);
    });

    it('an instance whose clock runs ahead cannot expire the open sequence of another early', async () => {
      const onTime = instance(Date.now);
      const early = instance(ahead);
      const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
      expect(await onTime.accept(fragments[0], context('on-time', Date.now()))).toMatchObject({
        status: 'stored',
      });

      expect(await early.listExpired(ahead(), 100)).not.toContainEqual(ref);
      expect(await early.expire(ref, ahead(), RETENTION_MS)).toBeNull();
      expect(await onTime.accept(fragments[1], context('on-time', Date.now()))).toMatchObject({
        status: 'complete',
      });
    });

    it('an instance whose clock runs ahead expires a sequence once its deadline passes on Redis', async () => {
      const onTime = instance(Date.now);
      const early = instance(ahead);
      const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
      await onTime.accept(fragments[0], context('on-time', Date.now()));

      // Fast-forwarded past the deadline, as a test of the sweeper would, on the skewed machine.
      const pastDeadline = ahead() + EXPIRY_MS + 1_000;
      expect(await early.listExpired(pastDeadline, 100)).toContainEqual(ref);
      const expired = await early.expire(ref, pastDeadline, RETENTION_MS);
      expect(expired).toMatchObject(ref);
      // Its age on one clock: not the skew more (firstFragmentAt is on Redis's).
      expect(expired!.ageMs).toBeGreaterThanOrEqual(EXPIRY_MS + 1_000 - 100);
      expect(expired!.ageMs).toBeLessThan(EXPIRY_MS + 1_000 + 5_000);
    });

    it('an instance whose clock runs ahead by more than the retention sees a finished sequence', async () => {
      const onTime = instance(Date.now);
      const early = instance(ahead);
      const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
      for (const fragment of fragments)
        await onTime.accept(fragment, context('on-time', Date.now()));
      const retentionMs = SKEW_MS / 2;
      expect(
        await onTime.finish(ref, 'completed', {
          now: Date.now(),
          retentionMs,
          consumerId: 'on-time',
        }),
      ).toBe(true);

      expect(await early.status(ref, ahead())).toEqual({ state: 'finished', outcome: 'completed' });
    });

    it('refuses a time that is not a number from its clock, before anything is stored', async () => {
      const broken = instance(() => Number.NaN);
      const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);

      await expect(broken.accept(fragments[0], context('broken', Date.now()))).rejects.toThrow(
        /clock must return the time in ms, returned NaN/,
      );
      expect(await redis.exists(`${prefix}:{seq:${ref.scope}:${ref.sequenceId}}:meta`)).toBe(0);
    });

    it('refuses a clock that is not a function', () => {
      expect(
        () => new RedisSequenceStore(redis, { prefix, clock: 5 as unknown as () => number }),
      ).toThrow(SequenceOptionsError);
    });
  });

  describe('RedisResequencerStore', () => {
    const opened: RedisResequencerStore[] = [];
    let key: ResequencerKey;

    function instance(clock: () => number): RedisResequencerStore {
      const store = RedisResequencerStore.connect(SERVERS.redis.url, { prefix, clock });
      opened.push(store);
      return store;
    }

    beforeEach(() => {
      key = { scope: 'clocks', key: randomUUID() };
    });

    afterEach(async () => {
      for (const store of opened.splice(0)) await store.close();
    });

    const entry = (seq: number): ResequencedEntry => ({
      seq,
      body: Buffer.from([seq]),
      headers: { 'x-resequence-seq': seq },
    });
    const limits = { maxBufferedPerKey: 100, maxBufferedTotal: 1_000 };
    const drain = (holder: string, now: number) => ({ holder, leaseMs: LEASE_MS, limit: 10, now });

    it('an instance whose clock runs ahead cannot take over the drain lease of another', async () => {
      const onTime = instance(Date.now);
      const early = instance(ahead);
      await onTime.accept(key, entry(1), { start: 1, limits, now: Date.now() });
      expect(await onTime.claimDrain(key, drain('on-time', Date.now()))).toMatchObject({
        kind: 'claimed',
      });

      expect(await early.claimDrain(key, drain('early', ahead()))).toEqual({ kind: 'busy' });
    });

    it("an instance whose clock runs ahead sees no gap past its deadline before Redis's clock does", async () => {
      const onTime = instance(Date.now);
      const early = instance(ahead);
      await onTime.accept(key, entry(2), { start: 1, limits, now: Date.now() });
      const gapTimeoutMs = 30_000;

      const openedBefore = ahead() - gapTimeoutMs;
      expect(await early.listGaps(key.scope, openedBefore, 10)).toEqual([]);
      expect(await early.resolveGap(key, 'skip', { openedBefore, now: ahead() })).toEqual({
        kind: 'none',
      });
      expect(await onTime.inspect(key, 1)).toMatchObject({ next: 1, buffered: [2] });
    });

    it('an instance whose clock runs ahead resolves a gap once its deadline passes on Redis', async () => {
      const onTime = instance(Date.now);
      const early = instance(ahead);
      await onTime.accept(key, entry(2), { start: 1, limits, now: Date.now() });

      const openedBefore = ahead() + 1_000;
      expect(await early.listGaps(key.scope, openedBefore, 10)).toMatchObject([{ key: key.key }]);
      expect(
        await early.resolveGap(key, 'skip', { openedBefore, now: ahead() + 1_000 }),
      ).toMatchObject({ kind: 'resolved' });
    });

    it.each([
      ['ahead', ahead],
      ['behind', behind],
    ])(
      'an instance whose clock runs %s dead-letters a key close to retention as the sweeper asks',
      async (_case, clock) => {
        const onTime = instance(Date.now);
        const skewed = instance(clock);
        await onTime.accept(key, entry(3), { start: 1, limits, now: Date.now() });
        // Nine tenths of the default retention (7 days) later, on the skewed machine's clock.
        const now = clock() + 604_800_000 - 60_480_000 + 1_000;

        const [gap] = await skewed.listExpiringGaps(key.scope, now, 10);
        expect(gap).toMatchObject({ key: key.key, expected: 1, lowest: 3 });
        // As Resequencer.sweep calls it: times on its own clock, changedAt as listed.
        await expect(
          skewed.resolveGap(key, 'dead-letter', {
            openedBefore: now,
            now,
            unchangedSince: gap.changedAt,
          }),
        ).resolves.toEqual({ kind: 'resolved', policy: 'dead-letter', appended: 1 });
      },
    );
  });

  describe('RedisClaimLedger', () => {
    const opened: RedisClaimLedger[] = [];
    const ticket = () => ({ ticket: `redis:${randomUUID()}`, group: 'orders.created' });

    function instance(clock: () => number): RedisClaimLedger {
      const ledger = RedisClaimLedger.connect(SERVERS.redis.url, { prefix, clock });
      opened.push(ledger);
      return ledger;
    }

    afterEach(async () => {
      for (const ledger of opened.splice(0)) await ledger.close();
    });

    it('an instance whose clock runs ahead cannot take over the claim of another', async () => {
      const onTime = instance(Date.now);
      const early = instance(ahead);
      const key = ticket();
      expect(await onTime.claim(key, 'on-time', LEASE_MS, Date.now())).toBe('claimed');

      expect(await early.claim(key, 'early', LEASE_MS, ahead())).toBe('busy');
    });

    it('an instance whose clock runs behind holds its claim on Redis time', async () => {
      const late = instance(behind);
      const onTime = instance(Date.now);
      const key = ticket();
      expect(await late.claim(key, 'late', LEASE_MS, behind())).toBe('claimed');

      expect(await onTime.claim(key, 'on-time', LEASE_MS, Date.now())).toBe('busy');
    });

    it('an instance whose clock runs behind keeps a completion for as long as it asks', async () => {
      const late = instance(behind);
      const onTime = instance(Date.now);
      const key = ticket();
      expect(await late.claim(key, 'late', LEASE_MS, behind())).toBe('claimed');
      await late.complete(key, 'late', behind() + 10_000, behind());

      // A redelivery of the ticket within those 10 s must not run the handler again.
      expect(await onTime.claim(key, 'on-time', LEASE_MS, Date.now())).toBe('done');
    });
  });
});
