import { randomBytes } from 'node:crypto';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { type HeaderMap } from 'nest-sequence/wire';
import { eventually, metricValue } from '../support/sequence-test-app';
import { useFaultServersOn } from './support/fault-servers';
import { keysUnder } from '../support/redis.fixture';
import { describeOnTransports } from '../support/transports.fixture';
import {
  createResequencerApp,
  publishKeyedEvent,
  type ResequencerApp,
} from './support/resequencer-app';
import { QueueCollector } from './support/resequencer-output';

jest.setTimeout(30_000);

/** Long enough that no gap policy applies during these tests. */
const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;

/** Header values of every wire type the resequencer must carry unchanged through Redis and the broker. */
const USER_HEADERS: HeaderMap = {
  tenant: 'acme',
  attempt: 3,
  urgent: true,
  archived: false,
  ratio: 0.25,
  big: 2 ** 40,
  empty: '',
};

/**
 * Ordering, duplicates and key isolation of `@Resequenced` on the real servers: the events go
 * through the broker, the keys' state lives in Redis (RedisResequencerStore), and released events
 * reach the handler, or the output channel, where the broker's plain client reads them.
 */
describeOnTransports(
  'faults: Resequencer with Redis, each key in strict order',
  ['redis'],
  (on) => {
    let inspector: RedisResequencerStore;
    let channel: string;
    let t: ResequencerApp | undefined;
    const servers = useFaultServersOn(on, {
      producer: true,
      beforeCleanup: async () => {
        await t?.close();
        t = undefined;
      },
    });

    beforeEach(() => {
      channel = servers.admin.newChannel();
      // A store of the test's own on the same prefix: what any other instance would see.
      inspector = new RedisResequencerStore(servers.redis, { prefix: servers.prefix });
    });

    const publish = (key: string, seqs: number[], headers: HeaderMap = {}) =>
      seqs.reduce(
        (previous, seq) =>
          previous.then(() => publishKeyedEvent(servers.producer, channel, { key, seq, headers })),
        Promise.resolve(),
      );
    const drained = async () => (await servers.admin.readyCount(channel)) === 0;
    const droppedCount = async () =>
      (await metricValue(t!.registry, 'nest_sequence_resequencer_events_total', {
        outcome: 'duplicate',
      })) +
      (await metricValue(t!.registry, 'nest_sequence_resequencer_events_total', {
        outcome: 'late',
      }));

    it('hands events that arrive in order on, each once, with every header typed as sent', async () => {
      t = await createResequencerApp({ channel, gap: GAP }, { prefix: servers.prefix, on });
      await publish('T1', [1, 2, 3, 4, 5], USER_HEADERS);

      await eventually(() => t!.handler.received.length === 5, 'five events');
      expect(t.handler.of('T1')).toEqual([1, 2, 3, 4, 5]);
      expect(t.handler.received.map((event) => event.body)).toEqual(
        [1, 2, 3, 4, 5].map((seq) => `T1#${seq}`),
      );
      expect(t.handler.received[2].headers).toEqual({
        ...USER_HEADERS,
        'x-resequence-key': 'T1',
        'x-resequence-seq': 3,
      });
      // The drain settles (trims) what it delivered once the handler has returned: wait for it.
      await eventually(
        async () => (await inspector.inspect({ scope: channel, key: 'T1' }, 1)).handOff === 0,
        'the hand-off list settled',
      );
      expect(await inspector.inspect({ scope: channel, key: 'T1' }, 1)).toEqual({
        next: 6,
        buffered: [],
        handOff: 0,
      });
      await eventually(drained, 'every input acked');
      expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
    });

    it('holds early events in Redis (input acked) until the gap fills, then releases the run in order', async () => {
      t = await createResequencerApp({ channel, gap: GAP }, { prefix: servers.prefix, on });
      await publish('T1', [4, 2, 5, 3]);

      await eventually(
        async () =>
          (await inspector.inspect({ scope: channel, key: 'T1' }, 1)).buffered.length === 4,
        'four events buffered in Redis',
      );
      expect(await inspector.inspect({ scope: channel, key: 'T1' }, 1)).toEqual({
        next: 1,
        buffered: [2, 3, 4, 5],
        handOff: 0,
        gapSince: expect.any(Number),
        heldBytes: expect.any(Number),
      });
      await eventually(drained, 'the buffered events acked');
      expect(t.handler.received).toEqual([]);

      await publish('T1', [1]);
      await eventually(() => t!.handler.received.length === 5, 'the whole run');
      expect(t.handler.of('T1')).toEqual([1, 2, 3, 4, 5]);
      expect(t.handler.received.map((event) => event.body)).toEqual(
        [1, 2, 3, 4, 5].map((seq) => `T1#${seq}`),
      );
      // Settles are sent a moment after the handler returns (batched per event-loop turn).
      await eventually(
        async () => (await inspector.inspect({ scope: channel, key: 'T1' }, 1)).handOff === 0,
        'the run settled',
      );
      expect(await inspector.inspect({ scope: channel, key: 'T1' }, 1)).toEqual({
        next: 6,
        buffered: [],
        handOff: 0,
      });
    });

    it('drops duplicates, buffered or already delivered (also copies published long after delivery)', async () => {
      t = await createResequencerApp({ channel, gap: GAP }, { prefix: servers.prefix, on });
      await publish('T1', [3, 3, 2, 1, 1, 2, 3]);
      await eventually(() => t!.handler.received.length >= 3, 'three events');
      await eventually(async () => (await droppedCount()) === 4, 'four copies dropped');

      // After delivery, a producer that retries (or a broker that redelivers) sends them again.
      await publish('T1', [1, 2, 3]);
      await eventually(async () => (await droppedCount()) === 7, 'seven copies dropped');
      await eventually(drained, 'every copy acked');

      expect(t.handler.of('T1')).toEqual([1, 2, 3]);
      // The last three came after `next` had moved past them: late, not buffered duplicates.
      expect(
        await metricValue(t.registry, 'nest_sequence_resequencer_events_total', {
          outcome: 'late',
        }),
      ).toBeGreaterThanOrEqual(3);
      expect(
        await metricValue(t.registry, 'nest_sequence_resequencer_delivered_total', {
          resequencer: channel,
        }),
      ).toBe(3);
      expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
    });

    it('keeps keys apart: a gap in one key never holds another back', async () => {
      t = await createResequencerApp({ channel, gap: GAP }, { prefix: servers.prefix, on });
      await publish('A', [2, 3]);
      await publish('B', [1, 2, 3]);
      await publish('C', [2, 1]);

      await eventually(() => t!.handler.of('B').length === 3, 'key B');
      await eventually(() => t!.handler.of('C').length === 2, 'key C');
      expect(t.handler.of('A')).toEqual([]);
      expect(await inspector.inspect({ scope: channel, key: 'A' }, 1)).toMatchObject({
        next: 1,
        buffered: [2, 3],
      });

      await publish('A', [1]);
      await eventually(() => t!.handler.of('A').length === 3, 'key A');
      expect(t.handler.of('A')).toEqual([1, 2, 3]);
      expect(t.handler.of('B')).toEqual([1, 2, 3]);
      expect(t.handler.of('C')).toEqual([1, 2]);
    });

    it('publishes to the output channel in order, byte-exact bodies and headers, and calls no handler', async () => {
      const output = servers.admin.newChannel();
      t = await createResequencerApp({ channel, output, gap: GAP }, { prefix: servers.prefix, on });
      // Binary bodies that are not valid UTF-8: any text round trip would change them.
      const bodies = new Map<string, Buffer>();
      const events = [
        ['P1', 3],
        ['P2', 2],
        ['P1', 1],
        ['P2', 1],
        ['P1', 2],
        ['P1', 1], // a duplicate
        ['P2', 3],
      ] as const;
      for (const [key, seq] of events) {
        const id = `${key}:${seq}`;
        if (!bodies.has(id))
          bodies.set(id, Buffer.concat([Buffer.from([0xff, 0x00, 0xc3]), randomBytes(64)]));
        await publishKeyedEvent(servers.producer, channel, {
          key,
          seq,
          body: bodies.get(id),
          headers: { ...USER_HEADERS, source: id },
        });
      }

      const reader = new QueueCollector(servers.admin, output);
      await reader.atLeast(6, 'six outputs');
      await eventually(drained, 'every input acked');
      await reader.collect(); // nothing more (the duplicate among them)

      expect(Object.fromEntries(reader.seqsByKey())).toEqual({ P1: [1, 2, 3], P2: [1, 2, 3] });
      for (const { body, headers } of reader.messages) {
        const id = `${String(headers['x-resequence-key'])}:${Number(headers['x-resequence-seq'])}`;
        expect(body.equals(bodies.get(id)!)).toBe(true);
        expect(headers).toEqual({
          ...USER_HEADERS,
          source: id,
          'x-resequence-key': id.split(':')[0],
          'x-resequence-seq': Number(id.split(':')[1]),
        });
      }
      expect(t.handler.received).toEqual([]);
      expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
      // What stays in Redis after delivery: per key, the state hash (next, for late duplicates), and
      // the scope's index; no buffer, no hand-off list.
      const left = await keysUnder(servers.redis, servers.prefix);
      expect(left.filter((key) => /:(buffer|handoff)$/.test(key))).toEqual([]);
    });

    it('past maxBufferedPerKey, requeues the refused event through the queue; once the gap fills it goes out in order, without transport headers', async () => {
      const output = servers.admin.newChannel();
      t = await createResequencerApp(
        { channel, output, gap: GAP, maxBufferedPerKey: 2 },
        { prefix: servers.prefix, backpressureDelayMs: 50, on },
      );
      await publish('P1', [2, 3, 4], USER_HEADERS);
      const refusals = () =>
        metricValue(t!.registry, 'nest_sequence_resequencer_events_total', { outcome: 'full' });
      // The event accepted last is refused, goes back to the tail of the queue (x-requeue-count),
      // and again. Most often 4; under load two accepts can reach the store in another order
      // (one waits on a read of the scope's totals): which one waits is not part of the order.
      await eventually(async () => (await refusals()) >= 2, 'an event refused twice');
      const state = await inspector.inspect({ scope: channel, key: 'P1' }, 1);
      expect({ next: state.next, buffered: state.buffered.length }).toEqual({
        next: 1,
        buffered: 2,
      });

      await publish('P1', [1], USER_HEADERS);
      const reader = new QueueCollector(servers.admin, output);
      await reader.atLeast(4, 'four outputs');
      expect(reader.seqsByKey().get('P1')).toEqual([1, 2, 3, 4]);
      // The requeued one included: no transport header (x-requeue-count) goes out.
      for (const [index, message] of reader.messages.entries()) {
        expect(message.headers).toEqual({
          ...USER_HEADERS,
          'x-resequence-key': 'P1',
          'x-resequence-seq': index + 1,
        });
      }
      await eventually(drained, 'every input acked');
      expect(await reader.collect()).toHaveLength(4);
      expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
    });
  },
);
