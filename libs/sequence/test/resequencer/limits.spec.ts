import { MemoryResequencerStore } from 'nest-sequence';
import { heldEntryBytes } from '../../src/ports/resequencer-store.port';
import { singleMetricValue } from '../faults/support/metrics';
import { eventually } from '../support/sequence-test-app';
import {
  createResequencerTestApp,
  publishEvent,
  type ResequencerTestApp,
} from './resequencer-test-app';

const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;
const channel = 'transfers.ledger';
const dlq = `${channel}.dlq`;
const KEY = 'T1';
/** Every event's body: 1 KiB. */
const BODY = 'x'.repeat(1_024);
/** What one event of KEY counts for: its body, its two headers and the fixed overhead. */
const eventBytes = (seq: number) =>
  heldEntryBytes({
    seq,
    body: Buffer.from(BODY),
    headers: { 'x-resequence-key': KEY, 'x-resequence-seq': seq },
  });

/** `from`..`to`, inclusive. */
const range = (from: number, to: number) =>
  Array.from({ length: to - from + 1 }, (_, index) => from + index);

describe('Resequencer limits (embedded defaults)', () => {
  let t: ResequencerTestApp;
  const store = () => new MemoryResequencerStore();

  afterEach(async () => {
    await t?.close();
  });

  const outcomes = (outcome: string) =>
    singleMetricValue(t.metrics.registry, 'nest_sequence_resequencer_events_total', { outcome });

  it('one key sent 40 times its maxBufferedBytesPerKey never holds more than it, and delivers everything in order', async () => {
    const maxBufferedBytesPerKey = 8 * eventBytes(99);
    const resequencerStore = store();
    t = await createResequencerTestApp(
      { channel, gap: GAP, maxBufferedBytesPerKey },
      { resequencer: { store: resequencerStore }, tuning: { backpressureDelayMs: 20 } },
    );
    const last = 41; // 40 KiB of bodies ahead of the gap at 1, against an 8-event budget
    for (const seq of range(2, last)) await publishEvent(t.transport, channel, KEY, seq, BODY);
    await eventually(async () => (await outcomes('full')) >= last - 1 - 8, 'every refusal');

    const state = await t.service.inspect(channel, KEY);
    expect(state.buffered).toHaveLength(8);
    expect(state.heldBytes).toBeLessThanOrEqual(maxBufferedBytesPerKey);
    expect(state.heldBytes).toBe(state.buffered.reduce((sum, seq) => sum + eventBytes(seq), 0));

    await publishEvent(t.transport, channel, KEY, 1, BODY);
    await eventually(() => t.handler.received.length === last, 'every event', 15_000);
    expect(t.handler.of(KEY)).toEqual(range(1, last));
    expect(t.transport.peek(dlq)).toEqual([]);
  });

  it("with overflow 'dead-letter', dead-letters the event that would pass maxBufferedBytesPerKey, naming the budget", async () => {
    t = await createResequencerTestApp({
      channel,
      gap: GAP,
      maxBufferedBytesPerKey: 2 * eventBytes(99),
      overflow: 'dead-letter',
    });
    for (const seq of [2, 3, 4]) await publishEvent(t.transport, channel, KEY, seq, BODY);
    await eventually(() => t.transport.peek(dlq).length === 1, 'the refused event');
    expect(String(t.transport.peek(dlq)[0].headers['x-death-reason'])).toMatch(
      /^resequencer-buffer-full: key T1, event 4: maxBufferedBytesPerKey reached while waiting for 1$/,
    );
    expect(await t.service.buffered(channel, KEY)).toEqual([2, 3]);
  });

  it('bounds the bytes of all keys together with maxBufferedBytesTotal', async () => {
    t = await createResequencerTestApp(
      { channel, gap: GAP, overflow: 'dead-letter' },
      { resequencer: { maxBufferedBytesTotal: 2 * eventBytes(2) + 10 } },
    );
    for (const key of ['A', 'B', 'C']) await publishEvent(t.transport, channel, key, 2, BODY);
    await eventually(() => t.transport.peek(dlq).length === 1, 'the third key refused');
    expect(String(t.transport.peek(dlq)[0].headers['x-death-reason'])).toMatch(
      /maxBufferedBytesTotal reached/,
    );
  });

  it('a held drain cannot let the hand-off list grow past maxBufferedPerKey; once it is let go, every event is delivered in order', async () => {
    const resequencerStore = store();
    t = await createResequencerTestApp(
      { channel, gap: GAP, maxBufferedPerKey: 10 },
      {
        resequencer: { store: resequencerStore },
        tuning: { backpressureDelayMs: 5, drain: { waitMs: 5 } },
      },
    );
    // Another instance released event 1 and holds the key's drain without delivering anything.
    const key = { scope: channel, key: KEY };
    const held = await resequencerStore.accept(
      key,
      { seq: 1, body: Buffer.from(BODY), headers: {} },
      {
        start: 1,
        limits: { maxBufferedPerKey: 10, maxBufferedTotal: 100 },
        now: Date.now(),
        drain: { holder: 'stuck', leaseMs: 600_000, limit: 32 },
      },
    );
    expect(held).toMatchObject({ kind: 'released', drain: { kind: 'claimed' } });

    const last = 200;
    for (const seq of range(2, last)) await publishEvent(t.transport, channel, KEY, seq, BODY);
    // Each event released once, or refused: every one was taken in hand at least once.
    await eventually(
      async () => (await outcomes('released')) + (await outcomes('full')) >= last - 1,
      'every event offered to the store',
      15_000,
    );
    const state = await t.service.inspect(channel, KEY);
    expect(state.handOff + state.buffered.length).toBeLessThanOrEqual(10);
    expect(state.handOff).toBeGreaterThan(0);
    expect(t.handler.received).toEqual([]);

    await resequencerStore.releaseDrain(key, 'stuck');
    await eventually(() => t.handler.received.length === last, 'every event', 30_000);
    expect(t.handler.of(KEY)).toEqual(range(1, last));
    await expect(t.service.inspect(channel, KEY)).resolves.toEqual({
      next: last + 1,
      buffered: [],
      handOff: 0,
    });
  });
});
