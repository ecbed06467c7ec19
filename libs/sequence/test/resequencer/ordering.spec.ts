import { eventually, metricValue, shuffled } from '../support/sequence-test-app';
import {
  createResequencerTestApp,
  publishEvent,
  type ResequencerTestApp,
} from './resequencer-test-app';

const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;

describe('Resequencer: each key in strict order (embedded defaults)', () => {
  let t: ResequencerTestApp;
  const channel = 'transfers.status';

  afterEach(async () => {
    await t?.close();
  });

  it('hands events that arrive in order straight on, each once', async () => {
    t = await createResequencerTestApp({ channel, gap: GAP });
    for (let seq = 1; seq <= 5; seq++) await publishEvent(t.transport, channel, 'T1', seq);
    await eventually(() => t.handler.received.length === 5, 'five events');
    expect(t.handler.of('T1')).toEqual([1, 2, 3, 4, 5]);
    expect(t.handler.received[0].body).toBe('T1#1');
  });

  it('holds early events until the gap before them fills, then releases the run in order', async () => {
    t = await createResequencerTestApp({ channel, gap: GAP });
    for (const seq of [3, 5, 4, 2]) await publishEvent(t.transport, channel, 'T1', seq);
    await eventually(
      async () => (await t.service.buffered(channel, 'T1')).length === 4,
      'buffered',
    );
    expect(t.handler.received).toEqual([]);
    expect(await t.service.nextExpected(channel, 'T1')).toBe(1);

    await publishEvent(t.transport, channel, 'T1', 1);
    await eventually(() => t.handler.received.length === 5, 'the whole run');
    expect(t.handler.of('T1')).toEqual([1, 2, 3, 4, 5]);
    expect(await t.service.inspect(channel, 'T1')).toEqual({
      next: 6,
      buffered: [],
      handOff: 0,
    });
  });

  it('drops duplicates, buffered or already delivered, and counts them', async () => {
    t = await createResequencerTestApp({ channel, gap: GAP });
    for (const seq of [2, 2, 1, 1, 2, 3, 1]) await publishEvent(t.transport, channel, 'T1', seq);
    await eventually(() => t.handler.received.length >= 3, 'three events');
    await eventually(() => t.transport.peek(channel).length === 0, 'the channel drained');
    expect(t.handler.of('T1')).toEqual([1, 2, 3]);
    const dropped = async (outcome: string) =>
      metricValue(t.metrics.registry, 'nest_sequence_resequencer_events_total', { outcome });
    // Which copies count as duplicates (buffered) or late (released) depends on arrival order.
    expect((await dropped('duplicate')) + (await dropped('late'))).toBe(4);
  });

  it('keeps keys apart: a gap in one key never holds another back', async () => {
    t = await createResequencerTestApp({ channel, gap: GAP });
    await publishEvent(t.transport, channel, 'A', 2);
    for (let seq = 1; seq <= 3; seq++) await publishEvent(t.transport, channel, 'B', seq);
    await eventually(() => t.handler.of('B').length === 3, 'key B');
    expect(t.handler.of('A')).toEqual([]);
    await publishEvent(t.transport, channel, 'A', 1);
    await eventually(() => t.handler.of('A').length === 2, 'key A');
    expect(t.handler.of('A')).toEqual([1, 2]);
  });

  it('delivers interleaved, shuffled keys each in order (many events, concurrent intake)', async () => {
    t = await createResequencerTestApp({ channel, gap: GAP, prefetch: 32 });
    const events = Array.from({ length: 20 }, (_, key) =>
      Array.from({ length: 25 }, (__, i) => ({ key: `K${key}`, seq: i + 1 })),
    ).flat();
    for (const { key, seq } of shuffled(events, 5)) {
      await publishEvent(t.transport, channel, key, seq);
    }
    await eventually(() => t.handler.received.length === events.length, 'every event', 10_000);
    for (let key = 0; key < 20; key++) {
      expect(t.handler.of(`K${key}`)).toEqual(Array.from({ length: 25 }, (_, i) => i + 1));
    }
  });

  it('starts each key at `start` (0 here) and reads key and seq with functions of the message', async () => {
    t = await createResequencerTestApp({
      channel,
      start: 0,
      key: (message) => (JSON.parse(message.body.toString()) as { id: string }).id,
      seq: (message) => (JSON.parse(message.body.toString()) as { n: number }).n,
      gap: GAP,
    });
    for (const n of [1, 0, 2]) {
      await t.transport.publish(channel, Buffer.from(JSON.stringify({ id: 'order-9', n })), {});
    }
    await eventually(() => t.handler.received.length === 3, 'three events');
    expect(t.handler.of('order-9')).toEqual([0, 1, 2]);
  });

  it('passes the producer headers through, typed, without the transport headers', async () => {
    t = await createResequencerTestApp({ channel, gap: GAP });
    await publishEvent(t.transport, channel, 'T1', 1, 'body', {
      tenant: 'acme',
      attempt: 3,
      urgent: true,
    });
    await eventually(() => t.handler.received.length === 1, 'one event');
    expect(t.handler.received[0].headers).toEqual({
      tenant: 'acme',
      attempt: 3,
      urgent: true,
      'x-resequence-key': 'T1',
      'x-resequence-seq': 1,
    });
  });
});

describe('Resequencer: an output channel', () => {
  let t: ResequencerTestApp;
  const channel = 'pix-status-shuffled';
  const output = 'pix-status-ordered';

  afterEach(async () => {
    await t?.close();
  });

  it('publishes released events in order, with key and sequence headers, and calls no handler', async () => {
    t = await createResequencerTestApp({ channel, output, gap: GAP });
    for (const seq of [2, 3, 1]) await publishEvent(t.transport, channel, 'P1', seq);
    await eventually(() => t.transport.peek(output).length === 3, 'three outputs');
    const published = t.transport.peek(output);
    expect(published.map((message) => message.body.toString())).toEqual(['P1#1', 'P1#2', 'P1#3']);
    expect(published.map((message) => message.headers['x-resequence-seq'])).toEqual([1, 2, 3]);
    expect(published.every((message) => message.headers['x-resequence-key'] === 'P1')).toBe(true);
    expect(t.handler.received).toEqual([]);
  });

  it('with callHandler: true, publishes and calls the handler, both in order', async () => {
    t = await createResequencerTestApp({ channel, output, callHandler: true, gap: GAP });
    for (const seq of [2, 1]) await publishEvent(t.transport, channel, 'P1', seq);
    await eventually(() => t.handler.received.length === 2, 'two calls');
    expect(t.handler.of('P1')).toEqual([1, 2]);
    expect(t.transport.peek(output).map((message) => message.headers['x-resequence-seq'])).toEqual([
      1, 2,
    ]);
  });
});
