import { randomBytes } from 'node:crypto';
import type { HeaderValue } from '../../../core/headers';
import type { ResequencerKey } from '../../../ports/resequencer-store.port';
import {
  acceptAll,
  acceptAt,
  drainAll,
  drainAt,
  event,
  eventSeqs,
  LEASE_MS,
  range,
  type ResequencerSuiteContext,
} from './resequencer-suite.context';

/** The hand-off list and its drain lease; what items carry; stalled hand-offs. */
export function describeDrainCases(c: ResequencerSuiteContext): void {
  describe('drain', () => {
    it('answers empty, taking no lease, when nothing is waiting', async () => {
      const key = c.key();
      await expect(c.store.claimDrain(key, drainAt(c.t0, 'a'))).resolves.toEqual({ kind: 'empty' });
      await acceptAll(c.store, key, [1], c.t0 + 1);
      await expect(c.store.claimDrain(key, drainAt(c.t0 + 2, 'b'))).resolves.toMatchObject({
        kind: 'claimed',
      });
    });

    it('hands out at most `limit` items per batch, in release order, until empty', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 2, 3, 4, 5], c.t0);
      const at = drainAt(c.t0 + 1, 'a', 2);
      const first = await c.store.claimDrain(key, at);
      expect(first.kind === 'claimed' && eventSeqs(first.items)).toEqual([1, 2]);
      const second = await c.store.settleDrain(key, 2, at);
      expect(second.kind === 'claimed' && eventSeqs(second.items)).toEqual([3, 4]);
      const third = await c.store.settleDrain(key, 2, at);
      expect(third.kind === 'claimed' && eventSeqs(third.items)).toEqual([5]);
      await expect(c.store.settleDrain(key, 1, at)).resolves.toEqual({ kind: 'empty' });
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ handOff: 0 });
    });

    it('trims only the settled count: unsettled items are handed out again', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 2, 3], c.t0);
      const at = drainAt(c.t0 + 1, 'a', 3);
      await c.store.claimDrain(key, at);
      const next = await c.store.settleDrain(key, 1, at);
      expect(next.kind === 'claimed' && eventSeqs(next.items)).toEqual([2, 3]);
    });

    it('answers busy to another holder while the lease is live', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await c.store.claimDrain(key, drainAt(c.t0, 'a'));
      await expect(c.store.claimDrain(key, drainAt(c.t0 + 1, 'b'))).resolves.toEqual({
        kind: 'busy',
      });
      await expect(c.store.claimDrain(key, drainAt(c.t0 + LEASE_MS - 1, 'b'))).resolves.toEqual({
        kind: 'busy',
      });
    });

    it('lets another holder take an expired lease over; the first then settles nothing', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 2], c.t0);
      await c.store.claimDrain(key, { ...drainAt(c.t0, 'a'), leaseMs: 1_000 });
      const takeOver = await c.store.claimDrain(key, drainAt(c.t0 + 1_000, 'b'));
      expect(takeOver.kind === 'claimed' && eventSeqs(takeOver.items)).toEqual([1, 2]);

      await expect(c.store.settleDrain(key, 2, drainAt(c.t0 + 1_001, 'a'))).resolves.toEqual({
        kind: 'lost',
      });
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ handOff: 2 });
      await expect(c.store.settleDrain(key, 2, drainAt(c.t0 + 1_002, 'b'))).resolves.toEqual({
        kind: 'empty',
      });
    });

    it('lets the holder settle after its lease expired when nobody took it over', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 2], c.t0);
      await c.store.claimDrain(key, { ...drainAt(c.t0, 'a', 1), leaseMs: 1_000 });
      const next = await c.store.settleDrain(key, 1, drainAt(c.t0 + 5_000, 'a', 1));
      expect(next.kind === 'claimed' && eventSeqs(next.items)).toEqual([2]);
    });

    it('answers lost to a settle without any lease, or by someone who does not hold it', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await expect(c.store.settleDrain(key, 1, drainAt(c.t0, 'a'))).resolves.toEqual({
        kind: 'lost',
      });
      await c.store.claimDrain(key, drainAt(c.t0, 'a'));
      await expect(c.store.settleDrain(key, 1, drainAt(c.t0 + 1, 'b'))).resolves.toEqual({
        kind: 'lost',
      });
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ handOff: 1 });
    });

    it('renews the lease when its holder claims again, handing out the head again', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      const lease = (now: number, holder: string) => ({ ...drainAt(now, holder), leaseMs: 1_000 });
      await c.store.claimDrain(key, lease(c.t0, 'a'));
      const again = await c.store.claimDrain(key, lease(c.t0 + 900, 'a'));
      expect(again.kind === 'claimed' && eventSeqs(again.items)).toEqual([1]);
      await expect(c.store.claimDrain(key, lease(c.t0 + 1_500, 'b'))).resolves.toEqual({
        kind: 'busy',
      });
      await expect(c.store.claimDrain(key, lease(c.t0 + 1_900, 'b'))).resolves.toMatchObject({
        kind: 'claimed',
      });
    });

    it('renews the lease on a settle that leaves items', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 2], c.t0);
      const lease = (now: number, holder: string) => ({
        ...drainAt(now, holder, 1),
        leaseMs: 1_000,
      });
      await c.store.claimDrain(key, lease(c.t0, 'a'));
      await c.store.settleDrain(key, 1, lease(c.t0 + 900, 'a'));
      await expect(c.store.claimDrain(key, lease(c.t0 + 1_500, 'b'))).resolves.toEqual({
        kind: 'busy',
      });
    });

    it('releases the lease when a settle empties the list', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await c.store.claimDrain(key, drainAt(c.t0, 'a'));
      await expect(c.store.settleDrain(key, 1, drainAt(c.t0, 'a'))).resolves.toEqual({
        kind: 'empty',
      });
      await c.store.accept(key, event(2), acceptAt(c.t0 + 1));
      await expect(c.store.claimDrain(key, drainAt(c.t0 + 2, 'b'))).resolves.toMatchObject({
        kind: 'claimed',
      });
    });

    it('lets another holder claim at once after the holder releases', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await c.store.claimDrain(key, drainAt(c.t0, 'a'));
      await c.store.releaseDrain(key, 'a');
      await expect(c.store.claimDrain(key, drainAt(c.t0 + 1, 'b'))).resolves.toMatchObject({
        kind: 'claimed',
      });
    });

    it('claims the lease with the release when accept is given a drain holder', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [2, 3], c.t0);
      const drain = { holder: 'a', leaseMs: LEASE_MS, limit: 2 };
      const outcome = await c.store.accept(key, event(1), { ...acceptAt(c.t0 + 1), drain });
      expect(outcome).toMatchObject({ kind: 'released', next: 4, count: 3 });
      const claim = outcome.kind === 'released' ? outcome.drain : undefined;
      expect(claim?.kind === 'claimed' && eventSeqs(claim.items)).toEqual([1, 2]);
      await expect(c.store.claimDrain(key, drainAt(c.t0 + 2, 'b'))).resolves.toEqual({
        kind: 'busy',
      });
      const next = await c.store.settleDrain(key, 2, drainAt(c.t0 + 3, 'a', 2));
      expect(next.kind === 'claimed' && eventSeqs(next.items)).toEqual([3]);
    });

    it('answers busy with the release when another holder drains the key', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await c.store.claimDrain(key, drainAt(c.t0 + 1, 'a'));
      const drain = { holder: 'b', leaseMs: LEASE_MS, limit: 10 };
      await expect(
        c.store.accept(key, event(2), { ...acceptAt(c.t0 + 2), drain }),
      ).resolves.toEqual({ kind: 'released', next: 3, count: 1, drain: { kind: 'busy' } });
      expect(eventSeqs(await drainAll(c.store, key, c.t0 + 3, 'a'))).toEqual([1, 2]);
    });

    it('claims for a late event only while something is pending, and never without a holder', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      const drain = { holder: 'a', leaseMs: LEASE_MS, limit: 10 };
      const pending = await c.store.accept(key, event(1), { ...acceptAt(c.t0 + 1), drain });
      expect(pending).toMatchObject({ kind: 'late', pending: true });
      const claim = pending.kind === 'late' ? pending.drain : undefined;
      expect(claim?.kind === 'claimed' && eventSeqs(claim.items)).toEqual([1]);
      await c.store.settleDrain(key, 1, drainAt(c.t0 + 2, 'a'));
      await expect(
        c.store.accept(key, event(1), { ...acceptAt(c.t0 + 3), drain }),
      ).resolves.toEqual({ kind: 'late', next: 2, pending: false });
      await expect(c.store.accept(key, event(2), acceptAt(c.t0 + 4))).resolves.toEqual({
        kind: 'released',
        next: 3,
        count: 1,
      });
    });

    it('counts claims as activity: a key its drainers keep claiming outlives the retention', async () => {
      const key = c.key();
      const R = c.retentionMs;
      await acceptAll(c.store, key, [1], c.t0);
      // Its delivery keeps failing: claimed, nothing settled, the lease let go each time.
      await c.store.claimDrain(key, drainAt(c.t0 + R / 2, 'a'));
      await c.store.releaseDrain(key, 'a');
      const drain = { holder: 'b', leaseMs: LEASE_MS, limit: 10 };
      await c.store.accept(key, event(1), { ...acceptAt(c.t0 + R * 0.95), drain });
      await c.store.releaseDrain(key, 'b');

      // Past t0 + retention, but within it of the last claim: event 1 is still to be delivered,
      // and the key still expects 2.
      const later = c.t0 + R * 1.2;
      const claim = await c.store.claimDrain(key, drainAt(later, 'c'));
      expect(claim.kind === 'claimed' && eventSeqs(claim.items)).toEqual([1]);
      await c.store.settleDrain(key, 1, drainAt(later, 'c'));
      await expect(c.store.accept(key, event(2), acceptAt(later + 1))).resolves.toMatchObject({
        kind: 'released',
        next: 3,
      });
    });

    it('renews the lease of its holder, so that nobody takes it over meanwhile', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await c.store.claimDrain(key, drainAt(c.t0, 'a'));
      await expect(c.store.renewDrain(key, 'a', LEASE_MS, c.t0 + LEASE_MS - 1)).resolves.toBe(true);
      await expect(c.store.claimDrain(key, drainAt(c.t0 + LEASE_MS + 1, 'b'))).resolves.toEqual({
        kind: 'busy',
      });
    });

    it('renews an expired lease nobody took over', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await c.store.claimDrain(key, drainAt(c.t0, 'a'));
      await expect(c.store.renewDrain(key, 'a', LEASE_MS, c.t0 + LEASE_MS + 5)).resolves.toBe(true);
      await expect(c.store.claimDrain(key, drainAt(c.t0 + LEASE_MS + 6, 'b'))).resolves.toEqual({
        kind: 'busy',
      });
    });

    it("never takes a lease by renewing: not a free one, not another holder's", async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await expect(c.store.renewDrain(key, 'a', LEASE_MS, c.t0)).resolves.toBe(false);
      await c.store.claimDrain(key, drainAt(c.t0 + 1, 'b'));
      await expect(c.store.renewDrain(key, 'a', LEASE_MS, c.t0 + 2)).resolves.toBe(false);
      await expect(c.store.claimDrain(key, drainAt(c.t0 + 3, 'a'))).resolves.toEqual({
        kind: 'busy',
      });
    });

    it('tells a lapsed drainer it lost the lease once another took over, settled and let go', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await c.store.claimDrain(key, drainAt(c.t0, 'a'));
      const later = c.t0 + LEASE_MS + 1;
      await c.store.claimDrain(key, drainAt(later, 'b'));
      await expect(c.store.settleDrain(key, 1, drainAt(later, 'b'))).resolves.toEqual({
        kind: 'empty',
      });
      await acceptAll(c.store, key, [2], later + 1);
      await expect(c.store.renewDrain(key, 'a', LEASE_MS, later + 2)).resolves.toBe(false);
      await expect(c.store.settleDrain(key, 1, drainAt(later + 3, 'a'))).resolves.toEqual({
        kind: 'lost',
      });
      const rest = await drainAll(c.store, key, later + 4, 'c');
      expect(eventSeqs(rest)).toEqual([2]);
    });

    it('ignores a release by someone who does not hold the lease', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1], c.t0);
      await c.store.claimDrain(key, drainAt(c.t0, 'a'));
      await c.store.releaseDrain(key, 'b');
      await expect(c.store.claimDrain(key, drainAt(c.t0 + 1, 'b'))).resolves.toEqual({
        kind: 'busy',
      });
    });

    it('shows the hand-off list to every instance', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 2], c.t0);
      const peer = await c.peer();
      await c.store.claimDrain(key, drainAt(c.t0, 'a'));
      await expect(peer.claimDrain(key, drainAt(c.t0 + 1, 'b'))).resolves.toEqual({
        kind: 'busy',
      });
      expect(eventSeqs(await drainAll(peer, key, c.t0 + LEASE_MS, 'b'))).toEqual([1, 2]);
    });
  });

  describe('items', () => {
    it('keep random binary bodies byte-exact, the empty body included', async () => {
      const key = c.key();
      const bodies = [Buffer.alloc(0), randomBytes(1), randomBytes(4_096), Buffer.from([0, 255])];
      for (const [index, body] of bodies.entries()) {
        await c.store.accept(key, event(index + 1, body), acceptAt(c.t0));
      }
      const items = await drainAll(c.store, key, c.t0 + 1);
      expect(
        items.map((item) => item.kind === 'event' && Buffer.isBuffer(item.entry.body)),
      ).toEqual(bodies.map(() => true));
      expect(items.map((item) => item.kind === 'event' && item.entry.body.toString('hex'))).toEqual(
        bodies.map((body) => body.toString('hex')),
      );
    });

    it('keep header values with their exact types', async () => {
      const key = c.key();
      const headers: Record<string, HeaderValue> = {
        'x-resequence-key': key.key,
        'x-resequence-seq': 1,
        numeric: '42',
        truthy: 'true',
        empty: '',
        unicode: 'café ✓ 🚚',
        zero: 0,
        negative: -7,
        fraction: 0.25,
        large: Number.MAX_SAFE_INTEGER,
        yes: true,
        no: false,
      };
      await c.store.accept(key, event(2, Buffer.from('b'), headers), acceptAt(c.t0));
      await c.store.accept(key, event(1, Buffer.from('a'), {}), acceptAt(c.t0));
      const items = await drainAll(c.store, key, c.t0 + 1);
      expect(items).toEqual([
        { kind: 'event', entry: { seq: 1, body: Buffer.from('a'), headers: {} } },
        { kind: 'event', entry: { seq: 2, body: Buffer.from('b'), headers } },
      ]);
    });
  });

  describe('listStalledHandOffs', () => {
    /** A hand-off list filled by a gap resolution at `at`: gap-skipped 1, then event 2. */
    async function skippedAt(key: ResequencerKey, at: number): Promise<void> {
      await acceptAll(c.store, key, [2], at - 1);
      await expect(
        c.store.resolveGap(key, 'skip', { openedBefore: at, now: at }),
      ).resolves.toMatchObject({ kind: 'resolved' });
    }

    it('lists a key whose gap resolution is waiting since idleSince, not one younger', async () => {
      const key = c.key();
      await skippedAt(key, c.t0);
      await expect(c.store.listStalledHandOffs(c.scope, c.t0 - 1, 10)).resolves.toEqual([]);
      await expect(c.store.listStalledHandOffs(c.scope, c.t0, 10)).resolves.toEqual([key.key]);
    });

    it('does not list what accept released: its input message covers it until delivered', async () => {
      const key = c.key();
      await acceptAll(c.store, key, [1, 3], c.t0);
      await expect(c.store.inspect(key, 1)).resolves.toMatchObject({ handOff: 1 });
      await expect(c.store.listStalledHandOffs(c.scope, c.t0 + 1_000, 10)).resolves.toEqual([]);
    });

    it('does not restart the wait on appends to a list that is not empty', async () => {
      const key = c.key();
      await skippedAt(key, c.t0);
      await acceptAll(c.store, key, [3], c.t0 + 100);
      await expect(c.store.listStalledHandOffs(c.scope, c.t0, 10)).resolves.toEqual([key.key]);
    });

    it('restarts the wait on each settle that leaves items, and forgets a drained key', async () => {
      const key = c.key();
      await skippedAt(key, c.t0);
      await c.store.claimDrain(key, drainAt(c.t0 + 10, 'a', 1));
      await c.store.settleDrain(key, 1, drainAt(c.t0 + 20, 'a', 1));
      await expect(c.store.listStalledHandOffs(c.scope, c.t0 + 19, 10)).resolves.toEqual([]);
      await expect(c.store.listStalledHandOffs(c.scope, c.t0 + 20, 10)).resolves.toEqual([key.key]);
      await c.store.settleDrain(key, 1, drainAt(c.t0 + 30, 'a', 1));
      await expect(c.store.listStalledHandOffs(c.scope, c.t0 + 1_000, 10)).resolves.toEqual([]);
      // Drained: what accept releases afterwards is not listed again.
      await acceptAll(c.store, key, [3], c.t0 + 40);
      await expect(c.store.listStalledHandOffs(c.scope, c.t0 + 1_000, 10)).resolves.toEqual([]);
    });

    it('lists the oldest first, up to limit, within the scope only', async () => {
      const names = ['k-late', 'k-early', 'k-middle'];
      const times = [c.t0 + 30, c.t0 + 10, c.t0 + 20];
      for (const [index, name] of names.entries()) await skippedAt(c.key(name), times[index]);
      await skippedAt({ scope: `${c.scope}.other`, key: 'k-other' }, c.t0);
      await expect(c.store.listStalledHandOffs(c.scope, c.t0 + 100, 10)).resolves.toEqual([
        'k-early',
        'k-middle',
        'k-late',
      ]);
      await expect(c.store.listStalledHandOffs(c.scope, c.t0 + 100, 2)).resolves.toEqual([
        'k-early',
        'k-middle',
      ]);
    });

    it('lists nothing for a key whose events are all buffered', async () => {
      await acceptAll(c.store, c.key(), [2, 3], c.t0);
      await expect(c.store.listStalledHandOffs(c.scope, c.t0 + 1_000, 10)).resolves.toEqual([]);
    });
  });

  it('releases a long run accepted in reverse order in one step, and drains it in batches', async () => {
    const key = c.key();
    await acceptAll(c.store, key, range(1, 250).reverse(), c.t0);
    expect(eventSeqs(await drainAll(c.store, key, c.t0 + 1, 'a', 64))).toEqual(range(1, 250));
  });
}
