import { Logger } from '@nestjs/common';
import { join } from 'node:path';
import { FilesystemPayloadStore } from 'nest-sequence';
import type { PayloadStore, SweepQuery } from 'nest-sequence/ports';
import { digestOf, digestOfBuffer } from '../../src/testing/conformance/payload-store.conformance';
import { settlesWithin } from '../../src/core/async';
import { bytes, eventually } from '../support/sequence-test-app';
import {
  claimMetric,
  createClaimCheckTestApp,
  deathReasons,
  filesUnder,
  publishTicket,
  type ClaimCheckTestApp,
} from './claim-check-test-app';
import { FaultInjectingPayloadStore } from './fault-injecting.payload-store';

/**
 * Claim Check: the orphan sweeper deletes payloads past their expiry and unpublished ones past
 * `orphanGraceMs`, in every configured store (read stores included), and nothing else.
 */
describe('claim check: orphan sweeper', () => {
  let t: ClaimCheckTestApp;
  afterEach(() => t.close());

  it('deletes expired payloads expiredGraceMs after their expiry, not before, and counts them', async () => {
    t = await createClaimCheckTestApp();
    const grace = t.options.claimCheck.expiredGraceMs;
    const soon = await t.claimCheck.checkIn(bytes(100, 1), { audience: t.channel, ttlMs: 10_000 });
    const later = await t.claimCheck.checkIn(bytes(100, 2), {
      audience: t.channel,
      ttlMs: 10_000 + grace + 10_000,
    });

    expect(await t.sweeper.sweep(soon.expiresAt)).toEqual({ expired: 0, orphaned: 0 });
    expect(await t.sweeper.sweep(soon.expiresAt + grace - 1)).toEqual({ expired: 0, orphaned: 0 });
    expect(await t.sweeper.sweep(soon.expiresAt + grace)).toEqual({ expired: 1, orphaned: 0 });
    expect(await t.store.head(soon.ref)).toBeUndefined();
    expect(await t.store.head(later.ref)).toBeDefined();
    expect(
      await claimMetric(t, 'payloads_deleted_total', { store: 'filesystem', reason: 'expired' }),
    ).toBe(1);
  });

  it('keeps a payload that expires while a handler reads it until the read is over', async () => {
    t = await createClaimCheckTestApp();
    const payload = bytes(1024 * 1024, 6);
    const ticket = await t.claimCheck.checkIn(payload, { audience: t.channel, ttlMs: 60_000 });
    let readBegun!: () => void;
    const begun = new Promise<void>((resolve) => (readBegun = resolve));
    let resumeRead!: () => void;
    const resumed = new Promise<void>((resolve) => (resumeRead = resolve));
    // A slow handler: it has accepted the ticket (before its expiry) and read a first chunk when
    // the expiry passes and a sweep runs, here or on another instance.
    t.handler.read = async (claimed) => {
      const chunks: Buffer[] = [];
      for await (const chunk of claimed.stream()) {
        chunks.push(chunk as Buffer);
        if (chunks.length === 1) {
          readBegun();
          await resumed;
        }
      }
      return Buffer.concat(chunks);
    };
    await publishTicket(t.transport, t.channel, ticket);
    await begun;

    try {
      expect(await t.sweeper.sweep(ticket.expiresAt + 1_000)).toEqual({
        expired: 0,
        orphaned: 0,
      });
      expect(await t.store.head(ticket.ref)).toBeDefined();
    } finally {
      resumeRead();
    }
    await t.transport.whenIdle();

    expect(t.handler.readErrors).toEqual([]);
    expect(t.handler.deliveries).toHaveLength(1);
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    expect(deathReasons(t.transport, t.channel)).toEqual([]);
  });

  it('deletes at most sweepBatch payloads per run; the next run takes the rest', async () => {
    t = await createClaimCheckTestApp({
      module: {
        tuning: { sweepers: { orphans: { batchSize: 2 } } },
      },
    });
    for (let index = 0; index < 3; index++) {
      await t.claimCheck.checkIn(bytes(10, index), { audience: t.channel, ttlMs: 1_000 });
    }
    const afterExpiry = Date.now() + 2_000 + t.options.claimCheck.expiredGraceMs;
    expect(await t.sweeper.sweep(afterExpiry)).toEqual({ expired: 2, orphaned: 0 });
    expect(await t.sweeper.sweep(afterExpiry)).toEqual({ expired: 1, orphaned: 0 });
    expect(await filesUnder(t.root)).toEqual([]);
  });

  it('passes over payloads whose delete failed, so that a full batch of them does not stop the sweep', async () => {
    const refused = new Set<string>();
    let firstListing = true;
    t = await createClaimCheckTestApp({
      module: { tuning: { sweepers: { orphans: { batchSize: 2 } } } },
      // A store that refuses for good to delete the first batch it lists (permissions, a lock).
      wrapStore: (inner) =>
        new Proxy(inner, {
          get: (target, property, receiver): unknown => {
            if (property === 'sweepCandidates') {
              return async (query: SweepQuery) => {
                const candidates = await target.sweepCandidates(query);
                if (firstListing) candidates.forEach(({ ref }) => refused.add(ref));
                firstListing = false;
                return candidates;
              };
            }
            if (property === 'delete') {
              return async (ref: string) => {
                if (refused.has(ref)) throw new Error(`permission denied: ${ref} (test)`);
                return target.delete(ref);
              };
            }
            return Reflect.get(target, property, receiver);
          },
        }),
    });
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    for (let index = 0; index < 3; index++) {
      await t.claimCheck.checkIn(bytes(10, index), { audience: t.channel, ttlMs: 1_000 });
    }
    const afterExpiry = Date.now() + 2_000 + t.options.claimCheck.expiredGraceMs;

    expect(await t.sweeper.sweep(afterExpiry)).toEqual({ expired: 0, orphaned: 0 });
    expect(refused.size).toBe(2);
    expect(warn).toHaveBeenCalledWith(expect.stringMatching(/tried again after the others/));
    // The next sweep reaches the third first, instead of failing on the same two again.
    expect(await t.sweeper.sweep(afterExpiry + 1)).toEqual({ expired: 1, orphaned: 0 });
    // The two are tried again where a batch has room.
    refused.clear();
    expect(await t.sweeper.sweep(afterExpiry + 2)).toEqual({ expired: 2, orphaned: 0 });
    expect(await filesUnder(t.root)).toEqual([]);
  });

  it('runs by itself every sweepIntervalMs when enabled', async () => {
    t = await createClaimCheckTestApp({
      claimCheck: { expiredGraceMs: 0 },
      module: {
        tuning: { sweepers: { orphans: { intervalMs: 20 } } },
      },
    });
    const ticket = await t.claimCheck.checkIn(bytes(100, 5), { audience: t.channel, ttlMs: 500 });
    await eventually(async () => (await t.store.head(ticket.ref)) === undefined, 'the sweep');
    expect(await filesUnder(t.root)).toEqual([]);
  });

  it('a sweep stuck on a store call holds shutdown for shutdownTimeoutMs at most, with a warning', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    let hung!: FaultInjectingPayloadStore;
    t = await createClaimCheckTestApp({
      module: { shutdownTimeoutMs: 200 },
      wrapStore: (store) => (hung = new FaultInjectingPayloadStore(store)),
    });
    try {
      hung.hangSweeps = true;
      void t.sweeper.sweep();

      const began = Date.now();
      const stopped = await settlesWithin(t.sweeper.stop(), 3_000);

      expect(stopped).toBe(true);
      expect(Date.now() - began).toBeGreaterThanOrEqual(190);
      expect(warn).toHaveBeenCalledWith(
        expect.stringMatching(
          /^the orphan sweep in progress did not finish within shutdownTimeoutMs \(200 ms\)/,
        ),
      );
    } finally {
      hung.releaseSweeps();
      warn.mockRestore();
    }
  });

  describe('an orphan whose ticket is confirmed after the sweep listed it', () => {
    /**
     * The store as the sweeper sees it: each listing returns its candidates, then the payloads
     * are marked published, as a slow `publish()` (or a consumer) does between the sweep's
     * listing and its delete.
     */
    const markedAfterListing =
      (hide: readonly string[] = []) =>
      (inner: PayloadStore): PayloadStore =>
        new Proxy(inner, {
          get: (target, property, receiver): unknown => {
            if (typeof property === 'string' && hide.includes(property)) return undefined;
            if (property === 'sweepCandidates') {
              return async (query: SweepQuery) => {
                const candidates = await target.sweepCandidates(query);
                for (const { ref } of candidates) await target.markPublished(ref);
                return candidates;
              };
            }
            const value: unknown = Reflect.get(target, property, receiver);
            return typeof value === 'function' ? value.bind(target) : value;
          },
        });

    it.each([
      ['a store that deletes only while unpublished', markedAfterListing()],
      ['a store without deleteUnpublished', markedAfterListing(['deleteUnpublished'])],
    ])('is kept, by %s', async (_label, wrapStore) => {
      t = await createClaimCheckTestApp({ wrapStore });
      const payload = bytes(100, 7);
      const now = Date.now();
      const { ref } = await t.store.put(payload, {
        now,
        expiresAt: now + 24 * 3_600_000,
        published: false,
      });

      const report = await t.sweeper.sweep(now + t.options.claimCheck.orphanGraceMs);

      expect(report).toEqual({ expired: 0, orphaned: 0 });
      expect(await t.store.head(ref)).toMatchObject({ published: true });
      expect(await digestOf(await t.store.get(ref))).toEqual(digestOfBuffer(payload));
    });

    it('is deleted while it is still unpublished', async () => {
      t = await createClaimCheckTestApp();
      const now = Date.now();
      const { ref } = await t.store.put(bytes(100, 8), {
        now,
        expiresAt: now + 24 * 3_600_000,
        published: false,
      });

      const report = await t.sweeper.sweep(now + t.options.claimCheck.orphanGraceMs);

      expect(report).toEqual({ expired: 0, orphaned: 1 });
      expect(await t.store.head(ref)).toBeUndefined();
    });
  });

  describe('with a read store beside the write store', () => {
    const READ_TIMEOUT_MS = 1_000;
    let primary: FaultInjectingPayloadStore;
    let archive: FilesystemPayloadStore;
    let archived: string;
    beforeEach(async () => {
      t = await createClaimCheckTestApp({
        claimCheck: { readTimeoutMs: READ_TIMEOUT_MS },
        wrapStore: (store) => (primary = new FaultInjectingPayloadStore(store, 'primary')),
        readStores: (dir) => [
          (archive = new FilesystemPayloadStore({ root: join(dir, 'archive') })),
        ],
      });
      const now = Date.now();
      ({ ref: archived } = await archive.put(bytes(100, 3), {
        now,
        expiresAt: now + 1_000,
        published: true,
      }));
    });

    afterEach(() => primary.releaseSweeps());
    const later = () => Date.now() + 2_000 + t.options.claimCheck.expiredGraceMs;

    it('sweeps the read store too', async () => {
      const report = await t.sweeper.sweep(
        Date.now() + 2_000 + t.options.claimCheck.expiredGraceMs,
      );
      expect(report).toEqual({ expired: 1, orphaned: 0 });
      expect(await archive.head(archived)).toBeUndefined();
    });

    it('a store that cannot be listed does not cost the other stores their sweep', async () => {
      const current = await t.claimCheck.checkIn(bytes(100, 4), {
        audience: t.channel,
        ttlMs: 1_000,
      });
      primary.failSweeps = 1;

      const report = await t.sweeper.sweep(
        Date.now() + 2_000 + t.options.claimCheck.expiredGraceMs,
      );

      expect(report).toEqual({ expired: 1, orphaned: 0 });
      expect(await archive.head(archived)).toBeUndefined();
      // The failed store is swept on the next run.
      expect(await t.store.head(current.ref)).toBeDefined();
      expect(
        await t.sweeper.sweep(Date.now() + 2_000 + t.options.claimCheck.expiredGraceMs),
      ).toEqual({
        expired: 1,
        orphaned: 0,
      });
      expect(await t.store.head(current.ref)).toBeUndefined();
    });

    it('a listing: given up on after readTimeoutMs, the other stores swept, and it on the next run', async () => {
      const current = await t.claimCheck.checkIn(bytes(100, 4), {
        audience: t.channel,
        ttlMs: 1_000,
      });
      primary.hangSweeps = true;

      const sweeping = t.sweeper.sweep(later());
      expect(await settlesWithin(sweeping, 10 * READ_TIMEOUT_MS)).toBe(true);
      expect(await sweeping).toEqual({ expired: 1, orphaned: 0 });
      expect(await archive.head(archived)).toBeUndefined();

      primary.releaseSweeps();
      expect(await t.sweeper.sweep(later())).toEqual({ expired: 1, orphaned: 0 });
      expect(await t.store.head(current.ref)).toBeUndefined();
    });

    it('a delete: given up on after readTimeoutMs, counted failed, and tried again on the next run', async () => {
      const current = await t.claimCheck.checkIn(bytes(100, 4), {
        audience: t.channel,
        ttlMs: 1_000,
      });
      primary.hangDeletes = 1;

      const sweeping = t.sweeper.sweep(later());
      expect(await settlesWithin(sweeping, 10 * READ_TIMEOUT_MS)).toBe(true);
      expect(await sweeping).toEqual({ expired: 1, orphaned: 0 });
      expect(await t.store.head(current.ref)).toBeDefined();

      expect(await t.sweeper.sweep(later())).toEqual({ expired: 1, orphaned: 0 });
      expect(await t.store.head(current.ref)).toBeUndefined();
    });
  });
});
