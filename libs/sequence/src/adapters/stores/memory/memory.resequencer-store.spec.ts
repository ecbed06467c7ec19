import { describeResequencerStoreConformance } from '../../../testing/conformance/resequencer-store.conformance';
import {
  heldEntryBytes,
  type AcceptContext,
  type ResequencedEntry,
  type ResequencerKey,
} from '../../../ports/resequencer-store.port';
import { randomBytes } from 'node:crypto';
import { MemoryResequencerStore } from './memory.resequencer-store';
import type { ResequencerKeyRecord } from './memory-resequencer-record';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

const ENCRYPTION = { keys: [{ id: 'k1', key: randomBytes(32) }] };

describeResequencerStoreConformance('memory', {
  create: async () => new MemoryResequencerStore(),
  // One process, one store: a second consumer in it shares the same object.
  peer: async (store) => store,
});
describeResequencerStoreConformance('memory (encrypted)', {
  create: async () => new MemoryResequencerStore({ encryption: ENCRYPTION }),
  peer: async (store) => store,
});

describe('MemoryResequencerStore', () => {
  const t0 = 1_000_000;
  const RETENTION_MS = 60_000;
  const key: ResequencerKey = { scope: 'orders', key: 'order-1' };
  const event = (seq: number): ResequencedEntry => ({ seq, body: Buffer.from([seq]), headers: {} });
  const at = (now: number, maxBufferedTotal = 100): AcceptContext => ({
    start: 1,
    limits: { maxBufferedPerKey: 100, maxBufferedTotal },
    now,
  });
  const drain = (now: number, holder = 'a') => ({ holder, leaseMs: 1_000, limit: 10, now });

  let store: MemoryResequencerStore;

  beforeEach(() => {
    store = new MemoryResequencerStore({ retentionMs: RETENTION_MS });
  });

  describe('retention', () => {
    it('starts a key afresh once retentionMs passed since its last write', async () => {
      await store.accept(key, event(1), at(t0));
      await store.accept(key, event(3), at(t0 + 10));

      await expect(store.accept(key, event(1), at(t0 + 10 + RETENTION_MS))).resolves.toEqual({
        kind: 'released',
        next: 2,
        count: 1,
      });
      await expect(store.inspect(key, 1)).resolves.toMatchObject({ buffered: [], handOff: 1 });
    });

    it('counts no gap of a key past its retention in gapStats', async () => {
      await store.accept(key, event(3), at(t0));
      await store.accept({ ...key, key: 'other' }, event(2), at(t0 + 10));
      await expect(store.gapStats(key.scope, t0 + 100)).resolves.toEqual({
        openGaps: 2,
        oldestGapAgeMs: 100,
      });

      await expect(store.gapStats(key.scope, t0 + RETENTION_MS + 5)).resolves.toEqual({
        openGaps: 1,
        oldestGapAgeMs: RETENTION_MS - 5,
      });
    });

    it('restarts retention on every write, a drain claim included', async () => {
      await store.accept(key, event(2), at(t0));
      await store.accept(key, event(1), at(t0 + RETENTION_MS - 1));
      await store.claimDrain(key, drain(t0 + 2 * RETENTION_MS - 2));

      await expect(store.accept(key, event(1), at(t0 + 2 * RETENTION_MS + 100))).resolves.toEqual({
        kind: 'late',
        next: 3,
        pending: true,
      });
    });

    it('judges calls that pass no time by the latest time seen', async () => {
      await store.accept(key, event(5), at(t0));
      await store.accept({ ...key, key: 'other' }, event(1), at(t0 + RETENTION_MS));

      await expect(store.inspect(key, 1)).resolves.toEqual({ next: 1, buffered: [], handOff: 0 });
    });

    it('drops expired keys from listings and from the buffered total', async () => {
      await store.accept(key, event(2), at(t0));
      await store.accept({ ...key, key: 'young' }, event(2), at(t0 + RETENTION_MS - 1));
      await store.accept({ ...key, key: 'ready' }, event(1), at(t0));
      await store.accept({ ...key, key: 'clock' }, event(1), at(t0 + RETENTION_MS));

      const gaps = await store.listGaps(key.scope, t0 + RETENTION_MS, 10);
      expect(gaps.map((gap) => gap.key)).toEqual(['young']);
      // 'clock' was released by accept: not a stalled hand-off (its input message covers it).
      await expect(store.listStalledHandOffs(key.scope, t0 + RETENTION_MS, 10)).resolves.toEqual(
        [],
      );
      await expect(store.bufferedTotal(key.scope)).resolves.toBe(1);
    });

    it('frees the room of expired keys for maxBufferedTotal', async () => {
      await store.accept(key, event(2), at(t0, 1));

      await expect(
        store.accept({ ...key, key: 'other' }, event(2), at(t0 + RETENTION_MS, 1)),
      ).resolves.toEqual({ kind: 'buffered', next: 1, buffered: 1 });
    });

    it('frees a retired key once its time is up, with the next write, whatever keys were written before it', async () => {
      // Written before the retired key: ahead of it in order of last write, and live.
      await store.accept({ ...key, key: 'busy' }, event(1), at(t0));
      await store.accept(key, event(1), at(t0 + 1));
      await store.claimDrain(key, drain(t0 + 1));
      await store.settleDrain(key, 1, drain(t0 + 1));
      await expect(store.retire(key, 1_000, t0 + 2)).resolves.toBe(true);

      await store.accept({ ...key, key: 'later' }, event(1), at(t0 + 1_002));
      // Not looked up, not scanned: pruned from the retired keys' queue by that write.
      const { keys } = store as unknown as {
        keys: { scopes: Map<string, { keys: Map<string, unknown> }> };
      };
      expect([...keys.scopes.get(key.scope)!.keys.keys()]).toEqual(['busy', 'later']);
    });

    it('keeps no state for a late event or a refused one', async () => {
      await store.accept({ ...key, key: 'filler' }, event(3), at(t0, 1));
      await expect(store.accept(key, event(0), at(t0, 1))).resolves.toMatchObject({ kind: 'late' });
      await expect(store.accept(key, event(2), at(t0, 1))).resolves.toMatchObject({ kind: 'full' });

      await expect(store.inspect(key, 9)).resolves.toEqual({ next: 9, buffered: [], handOff: 0 });
    });
  });

  it('hands out copies: changing a claimed body does not change what is handed out again', async () => {
    await store.accept(key, event(1), at(t0));
    const first = await store.claimDrain(key, drain(t0));
    if (first.kind !== 'claimed' || first.items[0].kind !== 'event') throw new Error('not claimed');
    first.items[0].entry.body.fill(99);

    const again = await store.claimDrain(key, drain(t0 + 1));
    expect(again).toEqual({
      kind: 'claimed',
      items: [{ kind: 'event', entry: { seq: 1, body: Buffer.from([1]), headers: {} } }],
    });
  });

  it('forgets every key on close, and closes twice', async () => {
    await store.accept(key, event(3), at(t0));
    await store.close();
    await store.close();

    await expect(store.bufferedTotal(key.scope)).resolves.toBe(0);
    await expect(store.inspect(key, 1)).resolves.toEqual({ next: 1, buffered: [], handOff: 0 });
  });

  it.each([
    ['a start of -1', () => store.accept(key, event(1), { ...at(t0), start: -1 })],
    ['a fractional now', () => store.accept(key, event(1), at(t0 + 0.5))],
    ['an empty holder', () => store.claimDrain(key, drain(t0, ''))],
    ['an empty holder releasing', () => store.releaseDrain(key, '')],
    ['an empty scope to list', () => store.listGaps('', t0, 10)],
    ['a listing limit of 0', () => store.listStalledHandOffs(key.scope, t0, 0)],
    ['an unknown gap policy', () => resolveWith('later')],
  ])('rejects %s with a RangeError', async (_case, call) => {
    await store.accept(key, event(2), at(t0));
    await expect(call()).rejects.toThrow(RangeError);
  });

  function resolveWith(policy: string) {
    return store.resolveGap(key, policy as 'alert', { openedBefore: t0, now: t0 });
  }

  it.each([[{ retentionMs: 0 }], [{ retentionMs: 1.5 }]])('rejects the options %j', (options) => {
    expect(() => new MemoryResequencerStore(options)).toThrow(SequenceOptionsError);
    expect(() => new MemoryResequencerStore(options)).toThrow(
      `retentionMs must be an integer >= 1, got ${options.retentionMs}`,
    );
  });

  describe('with encryption', () => {
    const secret = (seq: number): ResequencedEntry => ({
      seq,
      body: Buffer.from(`patient: Jane Doe #${seq}`),
      headers: { 'x-patient': 'Jane Doe' },
    });
    let encrypted: MemoryResequencerStore;

    beforeEach(() => {
      encrypted = new MemoryResequencerStore({ encryption: ENCRYPTION });
    });

    /** What the store holds for `key` (its internals: what a heap dump would show). */
    function recordOf(): ResequencerKeyRecord {
      const { keys } = encrypted as unknown as {
        keys: { find(k: ResequencerKey, now: number): ResequencerKeyRecord | undefined };
      };
      const record = keys.find(key, t0);
      if (!record) throw new Error(`no record for ${key.key}`);
      return record;
    }

    function heldBytes(record: ResequencerKeyRecord): Buffer[] {
      return [
        ...[...record.buffer.values()].map((entry) => entry.body),
        ...record.handOff.flatMap((item) => ('entry' in item ? [item.entry.body] : [])),
      ];
    }

    it('holds events sealed, hands them out as they came, and counts their plaintext', async () => {
      await encrypted.accept(key, secret(2), at(t0));
      await encrypted.accept(key, secret(1), at(t0));

      const record = recordOf();
      const held = heldBytes(record);
      expect(held).toHaveLength(2);
      expect(held.filter((bytes) => bytes.includes('Jane Doe'))).toEqual([]);
      expect((await encrypted.inspect(key, 1)).heldBytes).toBe(
        heldEntryBytes(secret(1)) + heldEntryBytes(secret(2)),
      );
      await expect(encrypted.claimDrain(key, drain(t0))).resolves.toEqual({
        kind: 'claimed',
        items: [
          { kind: 'event', entry: secret(1) },
          { kind: 'event', entry: secret(2) },
        ],
      });
    });

    it('hands out an event altered in memory as undecryptable, never as an event', async () => {
      await encrypted.accept(key, secret(1), at(t0));
      const [item] = recordOf().handOff;
      if (item.kind !== 'event') throw new Error('expected a released event');
      item.entry.body[100] ^= 0x01;

      await expect(encrypted.claimDrain(key, drain(t0))).resolves.toEqual({
        kind: 'claimed',
        items: [
          {
            kind: 'undecryptable',
            seq: 1,
            detail: expect.stringMatching(
              /^key order-1, event 1: the stored event did not decrypt \(authentication-failed, key id "k1"\)/,
            ),
          },
        ],
      });
    });
  });
});
