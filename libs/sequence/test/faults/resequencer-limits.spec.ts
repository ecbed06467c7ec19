import { RedisResequencerStore } from 'nest-sequence/redis';
import { RedisResequencerKeys } from '../../src/adapters/stores/redis/redis-resequencer-keys';
import { heldEntryBytes } from '../../src/ports/resequencer-store.port';
import { eventually, metricValue } from '../support/sequence-test-app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';
import {
  createResequencerApp,
  publishKeyedEvent,
  type ResequencerApp,
} from './support/resequencer-app';

jest.setTimeout(60_000);

const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;
const KEY = 'T1';
/** Every event's body: 4 KiB of random-looking text. */
const BODY = Buffer.from('0123456789abcdef'.repeat(256));
const eventBytes = (seq: number) =>
  heldEntryBytes({
    seq,
    body: BODY,
    headers: { 'x-resequence-key': KEY, 'x-resequence-seq': seq },
  });
const range = (from: number, to: number) =>
  Array.from({ length: to - from + 1 }, (_, index) => from + index);

/**
 * The resequencer's budgets on RabbitMQ and Redis: what one key holds in Redis (its buffer and
 * its hand-off list) stays within its per-key budgets, whatever is sent and however long its
 * drain is held up; back-pressure then lets every event through, in order.
 */
describeOnRealServers('faults: a Resequencer key sent more than its budgets', () => {
  let t: ResequencerApp | undefined;
  let channel: string;
  let inspector: RedisResequencerStore;
  const servers = useFaultServers({
    producer: true,
    beforeCleanup: async () => {
      await t?.close();
      t = undefined;
    },
  });

  beforeEach(() => {
    channel = servers.admin.newChannel();
    inspector = new RedisResequencerStore(servers.redis, { prefix: servers.prefix });
  });

  const publish = async (seqs: number[]) => {
    for (const seq of seqs) {
      await publishKeyedEvent(servers.producer, channel, { key: KEY, seq, body: BODY });
    }
  };
  const outcomes = (outcome: string) =>
    metricValue(t!.registry, 'nest_sequence_resequencer_events_total', { outcome });

  /** The bytes Redis holds for the key's events: its buffer's members and hand-off items. */
  async function storedBytes(): Promise<number> {
    const keys = new RedisResequencerKeys(servers.prefix).of({ scope: channel, key: KEY });
    const members = await servers.redis.zrange(keys.buffer, 0, -1);
    const items = await servers.redis.lrange(keys.handOff, 0, -1);
    return [...members, ...items].reduce((sum, text) => sum + Buffer.byteLength(text), 0);
  }

  it('one key sent 40 times its maxBufferedBytesPerKey holds no more than it in Redis, then delivers everything in order', async () => {
    const maxBufferedBytesPerKey = 8 * eventBytes(99);
    t = await createResequencerApp(
      { channel, gap: GAP, maxBufferedBytesPerKey },
      { prefix: servers.prefix, backpressureDelayMs: 20 },
    );
    const last = 41;
    await publish(range(2, last));
    await eventually(async () => (await outcomes('full')) >= last - 1 - 8, 'every refusal', 20_000);

    const state = await inspector.inspect({ scope: channel, key: KEY }, 1);
    expect(state.buffered).toHaveLength(8);
    expect(state.heldBytes).toBeLessThanOrEqual(maxBufferedBytesPerKey);
    // Redis holds the bodies in base64 (4/3), in JSON with their headers and counted size.
    const stored = await storedBytes();
    expect(stored).toBeGreaterThan(8 * BODY.length);
    expect(stored).toBeLessThanOrEqual(Math.ceil((maxBufferedBytesPerKey * 4) / 3));
    await expect(inspector.bufferedBytes(channel)).resolves.toBe(state.heldBytes);

    await publish([1]);
    await eventually(() => t!.handler.received.length === last, 'every event', 30_000);
    expect(t.handler.of(KEY)).toEqual(range(1, last));
    await expect(inspector.bufferedBytes(channel)).resolves.toBe(0);
  });

  it('a held drain cannot let the hand-off list grow past maxBufferedPerKey; once it is let go, every event is delivered in order', async () => {
    t = await createResequencerApp(
      { channel, gap: GAP, maxBufferedPerKey: 10 },
      { prefix: servers.prefix, backpressureDelayMs: 5 },
    );
    // Another instance released event 1 and holds the key's drain without delivering anything.
    const key = { scope: channel, key: KEY };
    const held = await inspector.accept(
      key,
      { seq: 1, body: BODY, headers: {} },
      {
        start: 1,
        limits: { maxBufferedPerKey: 10, maxBufferedTotal: 100 },
        now: Date.now(),
        drain: { holder: 'stuck', leaseMs: 600_000, limit: 32 },
      },
    );
    expect(held).toMatchObject({ kind: 'released', drain: { kind: 'claimed' } });

    const last = 100;
    await publish(range(2, last));
    await eventually(
      async () => (await outcomes('released')) + (await outcomes('full')) >= last - 1,
      'every event offered to the store',
      30_000,
    );
    const state = await inspector.inspect(key, 1);
    expect(state.handOff + state.buffered.length).toBeLessThanOrEqual(10);
    expect(state.handOff).toBeGreaterThan(0);
    expect(await storedBytes()).toBeLessThanOrEqual(Math.ceil((10 * eventBytes(last) * 4) / 3));
    expect(t.handler.received).toEqual([]);

    await inspector.releaseDrain(key, 'stuck');
    await eventually(() => t!.handler.received.length === last, 'every event', 40_000);
    expect(t.handler.of(KEY)).toEqual(range(1, last));
    // Settles are sent a moment after the handler returns (batched per event-loop turn).
    await eventually(async () => (await inspector.inspect(key, 1)).handOff === 0, 'settled');
    await expect(inspector.inspect(key, 1)).resolves.toEqual({
      next: last + 1,
      buffered: [],
      handOff: 0,
    });
  });
});
