import { Logger } from '@nestjs/common';
import { join } from 'node:path';
import { FilesystemPayloadStore } from 'nest-sequence';
import { settlesWithin } from '../../src/core/async';
import { bytes, eventually } from '../support/sequence-test-app';
import {
  claimMetric,
  createClaimCheckTestApp,
  filesUnder,
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

  it('deletes expired payloads at their expiry, not before, and counts them', async () => {
    t = await createClaimCheckTestApp();
    const soon = await t.claimCheck.checkIn(bytes(100, 1), { ttlMs: 10_000 });
    const later = await t.claimCheck.checkIn(bytes(100, 2), { ttlMs: 20_000 });

    expect(await t.sweeper.sweep(soon.expiresAt - 1)).toEqual({ expired: 0, orphaned: 0 });
    expect(await t.sweeper.sweep(soon.expiresAt)).toEqual({ expired: 1, orphaned: 0 });
    expect(await t.store.head(soon.ref)).toBeUndefined();
    expect(await t.store.head(later.ref)).toBeDefined();
    expect(
      await claimMetric(t, 'payloads_deleted_total', { store: 'filesystem', reason: 'expired' }),
    ).toBe(1);
  });

  it('deletes at most sweepBatch payloads per run; the next run takes the rest', async () => {
    t = await createClaimCheckTestApp({ claimCheck: { sweepBatch: 2 } });
    for (let index = 0; index < 3; index++) {
      await t.claimCheck.checkIn(bytes(10, index), { ttlMs: 1_000 });
    }
    const afterExpiry = Date.now() + 2_000;
    expect(await t.sweeper.sweep(afterExpiry)).toEqual({ expired: 2, orphaned: 0 });
    expect(await t.sweeper.sweep(afterExpiry)).toEqual({ expired: 1, orphaned: 0 });
    expect(await filesUnder(t.root)).toEqual([]);
  });

  it('runs by itself every sweepIntervalMs when enabled', async () => {
    t = await createClaimCheckTestApp({ claimCheck: { sweepIntervalMs: 20 } });
    const ticket = await t.claimCheck.checkIn(bytes(100, 5), { ttlMs: 1 });
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
      const stopped = await settlesWithin(t.sweeper.beforeApplicationShutdown(), 3_000);

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

  describe('with a read store beside the write store', () => {
    let primary: FaultInjectingPayloadStore;
    let archive: FilesystemPayloadStore;
    let archived: string;
    beforeEach(async () => {
      t = await createClaimCheckTestApp({
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

    it('sweeps the read store too', async () => {
      const report = await t.sweeper.sweep(Date.now() + 2_000);
      expect(report).toEqual({ expired: 1, orphaned: 0 });
      expect(await archive.head(archived)).toBeUndefined();
    });

    it('a store that cannot be listed does not cost the other stores their sweep', async () => {
      const current = await t.claimCheck.checkIn(bytes(100, 4), { ttlMs: 1_000 });
      primary.failSweeps = 1;

      const report = await t.sweeper.sweep(Date.now() + 2_000);

      expect(report).toEqual({ expired: 1, orphaned: 0 });
      expect(await archive.head(archived)).toBeUndefined();
      // The failed store is swept on the next run.
      expect(await t.store.head(current.ref)).toBeDefined();
      expect(await t.sweeper.sweep(Date.now() + 2_000)).toEqual({ expired: 1, orphaned: 0 });
      expect(await t.store.head(current.ref)).toBeUndefined();
    });
  });
});
