import { MemoryResequencerStore } from '../../src/adapters/stores/memory/memory.resequencer-store';
import { InMemoryTransport } from '../../src/adapters/transports/in-memory/in-memory.transport';
import type { INestApplicationContext } from '@nestjs/common';
import { ConsumerHost } from '../../src/kernel/consumer.host';
import { eventually, FaultInjectingTransport } from '../support/sequence-test-app';
import {
  createResequencerTestApp,
  publishEvent,
  type ResequencerTestApp,
} from './resequencer-test-app';
import { sleep } from './resequencer-parts';

const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;
const channel = 'transfers.status';
const dlq = `${channel}.dlq`;
const OUTPUT = 'transfers.ordered';

/**
 * A transport over `broker` whose publishes to `slowed` each take 20 ms to be confirmed, and which
 * counts those begun once the app it is `watch`ing began to stop; `seqs` reads back the sequence
 * numbers `slowed` holds.
 */
function slowedAfterStop(broker: InMemoryTransport, slowed: string) {
  const transport = new FaultInjectingTransport(broker);
  let stopped = false;
  let sentAfterStop = 0;
  transport.beforePublish = async ({ channel: to }) => {
    if (to !== slowed) return;
    if (stopped) sentAfterStop++;
    await sleep(20);
  };
  return {
    transport,
    watch: (app: INestApplicationContext) =>
      app.get(ConsumerHost).stopping.addEventListener('abort', () => (stopped = true)),
    sentAfterStop: () => sentAfterStop,
    seqs: () => broker.peek(slowed).map((m) => Number(m.headers['x-resequence-seq'])),
  };
}

/** Publishes events 2..`events` of key T1 and waits until the key holds them all behind 1. */
async function holdAllButFirst(t: ResequencerTestApp, events: number): Promise<void> {
  for (let seq = 2; seq <= events; seq++) await publishEvent(t.transport, channel, 'T1', seq);
  await eventually(
    async () => (await t.service.buffered(channel, 'T1')).length === events - 1,
    'every event but the first held',
  );
}

describe('Resequencer: bad input and failures (embedded defaults)', () => {
  let t: ResequencerTestApp;

  afterEach(async () => {
    await t?.close();
  });

  const deathReasons = () =>
    t.transport.peek(dlq).map((message) => String(message.headers['x-death-reason']));

  it('dead-letters events without a usable key or sequence, saying which and why', async () => {
    t = await createResequencerTestApp({ channel, gap: GAP });
    const cases: Array<Record<string, string | number>> = [
      { 'x-resequence-seq': 1 },
      { 'x-resequence-key': 'T1' },
      { 'x-resequence-key': 'T1', 'x-resequence-seq': -1 },
      { 'x-resequence-key': 'T1', 'x-resequence-seq': 1.5 },
      { 'x-resequence-key': 'T1', 'x-resequence-seq': 'one' },
      // Its successor would not be exact: on Redis the key would jam, its next expected unreadable.
      { 'x-resequence-key': 'T1', 'x-resequence-seq': Number.MAX_SAFE_INTEGER },
      { 'x-resequence-key': '', 'x-resequence-seq': 1 },
      { 'x-resequence-key': 'bad\nkey', 'x-resequence-seq': 1 },
    ];
    for (const headers of cases) await t.transport.publish(channel, Buffer.from('x'), headers);
    await eventually(() => t.transport.peek(dlq).length === cases.length, 'every bad event');
    expect(deathReasons()).toEqual([
      expect.stringMatching(
        /^invalid-resequence-event: header x-resequence-key must be .*got nothing/,
      ),
      expect.stringMatching(
        /^invalid-resequence-event: header x-resequence-seq must be .*got nothing/,
      ),
      expect.stringMatching(/x-resequence-seq must be an integer >= 0 \(at most \d+\), got -1$/),
      expect.stringMatching(/x-resequence-seq must be an integer >= 0 \(at most \d+\), got 1.5$/),
      expect.stringMatching(/x-resequence-seq must be an integer >= 0 \(at most \d+\), got "one"$/),
      expect.stringMatching(
        /x-resequence-seq must be an integer >= 0 \(at most 9007199254740990\), got 9007199254740991$/,
      ),
      expect.stringMatching(/x-resequence-key must be 1-256 characters/),
      expect.stringMatching(/x-resequence-key must be 1-256 characters/),
    ]);
    expect(t.handler.received).toEqual([]);
  });

  it('dead-letters a fragment or a claim ticket rather than take part of a payload for an event', async () => {
    t = await createResequencerTestApp({ channel, gap: GAP });
    const event = { 'x-resequence-key': 'T1', 'x-resequence-seq': 1 };
    await t.transport.publish(channel, Buffer.from('part'), {
      ...event,
      'x-sequence-position': 1,
    });
    await t.transport.publish(channel, Buffer.from('{}'), { ...event, 'x-claim-check': 1 });
    await publishEvent(t.transport, channel, 'T1', 1, 'whole');
    await eventually(() => t.handler.received.length === 1, 'the whole event');
    expect(t.handler.received.map((e) => e.body.toString())).toEqual(['whole']);
    expect(deathReasons()).toEqual([
      expect.stringMatching(/^invalid-resequence-event: .*fragment of a Message Sequence/),
      expect.stringMatching(/^invalid-resequence-event: .*claim ticket/),
    ]);
  });

  it('dead-letters an event the transport can never send to output, and the key moves on', async () => {
    // 2 KiB messages: the first event fits on input, but not with the long key its output
    // headers add (nor as a dead letter with its reason): no retry can ever send it.
    const transport = new InMemoryTransport({ maxMessageBytes: 2048 });
    t = await createResequencerTestApp(
      {
        channel,
        output: 'transfers.ordered',
        key: () => 'K'.repeat(200),
        seq: (message) => Number(message.headers.s),
        gap: GAP,
      },
      // The splitter's fragment size must fit the small messages too.
      {
        transport,
        sequence: { fragmentBytes: 512 },
        tuning: { headerAllowanceBytes: 256 },
      },
    );
    const collected: Array<{ body: string; seq: unknown }> = [];
    await transport.subscribe('transfers.ordered', async (message) => {
      collected.push({ body: message.body.toString(), seq: message.headers['x-resequence-seq'] });
      return { action: 'ack' };
    });
    await transport.publish(channel, Buffer.alloc(1900, 'a'), { s: 1 });
    await transport.publish(channel, Buffer.from('small'), { s: 2 });
    // Before, event 1 was requeued forever and event 2 waited behind it.
    await eventually(() => collected.length === 1, 'event 2 on the output');
    expect(collected).toEqual([{ body: 'small', seq: 2 }]);
    await eventually(() => transport.peek(dlq).length === 1, 'the dead letter of event 1');
    const [dead] = transport.peek(dlq);
    expect(String(dead.headers['x-death-reason'])).toMatch(
      /^resequencer-output-unsendable: event 1; its body \(1900 bytes\) could not be sent either/,
    );
    expect(JSON.parse(dead.body.toString())).toEqual({
      kind: 'resequencer-output-unsendable',
      key: 'K'.repeat(200),
      seq: 1,
      bytes: 1900,
      bodyOmitted: true,
      reason: expect.stringMatching(
        /^resequencer-output-unsendable: key K+, event 1: the transport cannot send it to transfers\.ordered \(.*maxMessageBytes.*\); the key moved on$/,
      ),
    });
    await transport.close();
  });

  it('accepts a sequence sent as a decimal string (AMQP clients of other languages)', async () => {
    t = await createResequencerTestApp({ channel, gap: GAP });
    await t.transport.publish(channel, Buffer.from('a'), {
      'x-resequence-key': 'T1',
      'x-resequence-seq': '1',
    });
    await eventually(() => t.handler.received.length === 1, 'one event');
    expect(t.handler.of('T1')).toEqual([1]);
  });

  it('dead-letters an event whose key function throws, naming the error', async () => {
    t = await createResequencerTestApp({
      channel,
      key: (message) => (JSON.parse(message.body.toString()) as { id: string }).id,
      seq: () => 1,
      gap: GAP,
    });
    await t.transport.publish(channel, Buffer.from('not json'), {});
    await eventually(() => t.transport.peek(dlq).length === 1, 'the bad event');
    expect(deathReasons()[0]).toMatch(/^invalid-resequence-event: the key function threw: /);
  });

  it('dead-letters an event whose key function returns what cannot be shown as JSON (a bigint inside, a cycle)', async () => {
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    const keys = [{ id: BigInt(7) }, cyclic];
    t = await createResequencerTestApp({
      channel,
      key: (message) => keys[Number(message.body.toString())] as unknown as string,
      seq: () => 1,
      gap: GAP,
    });
    await t.transport.publish(channel, Buffer.from('0'), {});
    await t.transport.publish(channel, Buffer.from('1'), {});
    await eventually(() => t.transport.peek(dlq).length === 2, 'both bad events');
    expect(deathReasons()).toEqual([
      expect.stringMatching(/^invalid-resequence-event: the key function's result must be /),
      expect.stringMatching(/^invalid-resequence-event: the key function's result must be /),
    ]);
  });

  it('reads a key and a seq sent as AMQP byte arrays (Buffers) as UTF-8 text, and refuses bytes that are not UTF-8', async () => {
    t = await createResequencerTestApp({ channel, gap: GAP });
    await t.transport.publish(channel, Buffer.from('a'), {
      'x-resequence-key': Buffer.from('T1') as unknown as string,
      'x-resequence-seq': Buffer.from('1') as unknown as string,
    });
    // 0xff and 0xfe are both invalid UTF-8: decoded leniently they would be one key (U+FFFD).
    for (const byte of [0xff, 0xfe]) {
      await t.transport.publish(channel, Buffer.from('b'), {
        'x-resequence-key': Buffer.from([byte]) as unknown as string,
        'x-resequence-seq': 1,
      });
    }
    // A byte order mark is part of the key: BOM + "T1" is not "T1".
    await t.transport.publish(channel, Buffer.from('c'), {
      'x-resequence-key': Buffer.from([0xef, 0xbb, 0xbf, 0x54, 0x31]) as unknown as string,
      'x-resequence-seq': 1,
    });
    await eventually(() => t.handler.received.length === 2, 'two events');
    await eventually(() => t.transport.peek(dlq).length === 2, 'the two invalid keys');
    expect(t.handler.of('T1')).toEqual([1]);
    expect(t.handler.of('\ufeffT1')).toEqual([1]);
    expect(deathReasons()).toEqual([
      expect.stringMatching(/x-resequence-key must be .*valid UTF-8/),
      expect.stringMatching(/x-resequence-key must be .*valid UTF-8/),
    ]);
  });

  it('applies back-pressure past maxBufferedPerKey, and still takes the event that fills the gap', async () => {
    t = await createResequencerTestApp(
      { channel, gap: GAP, maxBufferedPerKey: 2 },
      {
        tuning: { backpressureDelayMs: 20 },
      },
    );
    for (const seq of [2, 3, 4]) await publishEvent(t.transport, channel, 'T1', seq);
    await eventually(
      async () => (await t.service.buffered(channel, 'T1')).length === 2,
      'two buffered',
    );
    await new Promise((resolve) => setTimeout(resolve, 100)); // 4 keeps coming back meanwhile
    expect(await t.service.buffered(channel, 'T1')).toEqual([2, 3]);
    await publishEvent(t.transport, channel, 'T1', 1);
    await eventually(() => t.handler.received.length === 4, 'all four');
    expect(t.handler.of('T1')).toEqual([1, 2, 3, 4]);
    expect(t.transport.peek(dlq)).toEqual([]);
  });

  it("with overflow 'dead-letter', dead-letters the event that would pass the bound", async () => {
    t = await createResequencerTestApp({
      channel,
      gap: GAP,
      maxBufferedPerKey: 1,
      overflow: 'dead-letter',
    });
    for (const seq of [2, 3]) await publishEvent(t.transport, channel, 'T1', seq);
    await eventually(() => t.transport.peek(dlq).length === 1, 'the refused event');
    expect(deathReasons()).toEqual([
      expect.stringMatching(
        /^resequencer-buffer-full: key T1, event 3: maxBufferedPerKey reached while waiting for 1$/,
      ),
    ]);
  });

  it('dead-letters an event more than maxSeqAhead past next, and the key goes on', async () => {
    // With the default overflow, 'backpressure': a requeue would bring it back for ever.
    t = await createResequencerTestApp({
      channel,
      gap: { timeoutMs: 60_000, policy: 'skip' },
      maxSeqAhead: 100,
    });
    await publishEvent(t.transport, channel, 'T1', 9_000_000); // a producer's bug
    await eventually(() => t.transport.peek(dlq).length === 1, 'the far-future event');
    for (const seq of [2, 1, 3]) await publishEvent(t.transport, channel, 'T1', seq);
    await eventually(() => t.handler.received.length === 3, 'events 1 to 3');

    expect(t.handler.of('T1')).toEqual([1, 2, 3]);
    expect(deathReasons()).toEqual([
      'invalid-resequence-event: key T1, event 9000000: more than maxSeqAhead (100) past 1, the next expected',
    ]);
  });

  it('dead-letters an event numbered below start (a producer counting from 0), and the key goes on', async () => {
    t = await createResequencerTestApp({ channel, gap: GAP });
    await publishEvent(t.transport, channel, 'T1', 0);
    await eventually(() => t.transport.peek(dlq).length === 1, 'the event below start');
    for (const seq of [2, 1]) await publishEvent(t.transport, channel, 'T1', seq);
    await eventually(() => t.handler.received.length === 2, 'events 1 and 2');

    expect(t.handler.of('T1')).toEqual([1, 2]);
    expect(deathReasons()).toEqual([
      'invalid-resequence-event: key T1, event 0: below 1, the first sequence number of every key (start)',
    ]);
  });

  it('dead-letters an early event larger than its key may buffer once it waited gap.timeoutMs for the events before it', async () => {
    // It can only be taken in order: were its predecessor lost, no gap would open (nothing is
    // buffered) and it would come back for ever.
    t = await createResequencerTestApp(
      { channel, gap: { timeoutMs: 300, policy: 'alert' }, maxBufferedBytesPerKey: 1_000 },
      { tuning: { backpressureDelayMs: 20 } },
    );
    const startedAt = Date.now();
    await publishEvent(t.transport, channel, 'T1', 2, 'x'.repeat(2_000));
    await eventually(() => t.transport.peek(dlq).length === 1, 'the oversized event');

    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(300);
    expect(deathReasons()).toEqual([
      expect.stringMatching(
        /^resequencer-buffer-full: key T1, event 2: maxBufferedBytesPerKey reached while waiting for 1; larger than that budget on its own, it could only be taken after 1, which did not come within gap\.timeoutMs \(300 ms\)$/,
      ),
    ]);
    await publishEvent(t.transport, channel, 'T1', 1);
    await eventually(() => t.handler.received.length === 1, 'event 1');
    expect(t.handler.of('T1')).toEqual([1]);
  });

  it('still takes an early event larger than its key may buffer in order, when the events before it come in time', async () => {
    t = await createResequencerTestApp(
      { channel, gap: { timeoutMs: 60_000, policy: 'alert' }, maxBufferedBytesPerKey: 1_000 },
      { tuning: { backpressureDelayMs: 20 } },
    );
    await publishEvent(t.transport, channel, 'T1', 2, 'x'.repeat(2_000));
    await sleep(100);
    await publishEvent(t.transport, channel, 'T1', 1);
    await eventually(() => t.handler.received.length === 2, 'events 1 and 2');

    expect(t.handler.of('T1')).toEqual([1, 2]);
    expect(t.transport.peek(dlq)).toEqual([]);
  });

  it('bounds all keys together with maxBufferedTotal', async () => {
    t = await createResequencerTestApp(
      { channel, gap: GAP, overflow: 'dead-letter' },
      { resequencer: { maxBufferedTotal: 2 } },
    );
    for (const key of ['A', 'B', 'C']) await publishEvent(t.transport, channel, key, 2);
    await eventually(() => t.transport.peek(dlq).length === 1, 'the third key refused');
    expect(deathReasons()[0]).toMatch(/maxBufferedTotal reached/);
  });

  it('dead-letters an event whose handler keeps failing, and the key moves on', async () => {
    t = await createResequencerTestApp({
      channel,
      gap: GAP,
      handlerRetry: { attempts: 2, baseDelayMs: 1 },
    });
    t.handler.failing.add('T1:2');
    for (const seq of [1, 2, 3]) await publishEvent(t.transport, channel, 'T1', seq);
    await eventually(() => t.handler.received.length === 2, 'events 1 and 3');
    expect(t.handler.of('T1')).toEqual([1, 3]);
    expect(t.transport.peek(dlq).map((message) => message.body.toString())).toEqual(['T1#2']);
    expect(deathReasons()[0]).toMatch(
      /^handler-failed: key T1, event 2: handler failed 2 time\(s\); last error: handler failure/,
    );
  });

  it('hands a retry the event body as it was sent, whatever the failed call did to it', async () => {
    t = await createResequencerTestApp({
      channel,
      gap: GAP,
      handlerRetry: { attempts: 2, baseDelayMs: 1 },
    });
    const seen: string[] = [];
    t.handler.onCall = async (event) => {
      seen.push(event.text());
      event.body.fill(0x58); // decoded in place
      if (seen.length === 1) throw new Error('downstream unavailable');
    };
    await publishEvent(t.transport, channel, 'T1', 1);
    await eventually(() => seen.length === 2, 'the retry');

    expect(seen).toEqual(['T1#1', 'T1#1']);
  });

  it('calls a failing handler no more once the shutdown drain is over, dead-letters nothing', async () => {
    const transport = new InMemoryTransport();
    t = await createResequencerTestApp(
      { channel, gap: GAP, handlerRetry: { attempts: 3, baseDelayMs: 1_000, maxDelayMs: 1_000 } },
      { transport, shutdownTimeoutMs: 100 },
    );
    let calls = 0;
    let closed = false;
    let callsAfterClose = 0;
    t.handler.onCall = async () => {
      calls++;
      if (closed) callsAfterClose++;
      throw new Error('downstream unavailable');
    };
    await publishEvent(transport, channel, 'T1', 1);
    await eventually(() => calls === 1, 'the first attempt failed');

    // The retry waits 500-1,000 ms; the drain gives up after 100.
    await t.close();
    closed = true;
    await new Promise((resolve) => setTimeout(resolve, 1_200));

    expect({ calls, callsAfterClose }).toEqual({ calls: 1, callsAfterClose: 0 });
    expect(transport.peek(dlq)).toEqual([]);
    expect(transport.depth(channel)).toBe(1); // its input, back for the next delivery
    await transport.close();
  });

  it.each([1, 4])(
    'publishes no event to output once the shutdown drain is over, and the next drain delivers the rest (outputInFlight %i)',
    async (outputInFlight) => {
      const broker = new InMemoryTransport();
      const slowed = slowedAfterStop(broker, OUTPUT);
      const { transport, seqs: onOutput } = slowed;
      const store = new MemoryResequencerStore();
      const definition = { channel, output: OUTPUT, outputInFlight, gap: GAP };
      const options = { transport, resequencer: { store }, shutdownTimeoutMs: 100 };
      t = await createResequencerTestApp(definition, options);
      slowed.watch(t.app);
      const events = 40;
      await holdAllButFirst(t, events);

      // 1 releases the key's events: its drain publishes them, 20 ms each, past the 100 ms the
      // shutdown waits for it.
      await publishEvent(transport, channel, 'T1', 1);
      await eventually(() => onOutput().length >= 2, 'the drain publishing');
      await t.close();
      await sleep(events * 20);

      expect(slowed.sentAfterStop()).toBe(0);
      const published = onOutput().length;
      expect(published).toBeLessThan(events);
      expect(await store.inspect({ scope: channel, key: 'T1' }, 1)).toMatchObject({
        next: events + 1,
        buffered: [],
        handOff: events - published, // settled what it published; the rest waits
      });
      expect(broker.peek(dlq)).toEqual([]);
      expect(t.gaps).toEqual([]);

      // The key's next drain (its input, delivered again) publishes the rest, once each.
      t = await createResequencerTestApp(definition, options);
      await eventually(() => onOutput().length === events, 'the rest on the output');
      expect(onOutput()).toEqual(Array.from({ length: events }, (_, i) => i + 1));
      await t.close();
      await broker.close();
    },
  );

  it('dead-letters no event once the shutdown drain is over, and the next drain moves out the rest', async () => {
    const broker = new InMemoryTransport();
    const slowed = slowedAfterStop(broker, dlq);
    const { transport, seqs: onDlq } = slowed;
    const store = new MemoryResequencerStore();
    const definition = { channel, gap: { timeoutMs: 60_000, policy: 'dead-letter' } } as const;
    const options = { transport, resequencer: { store }, shutdownTimeoutMs: 100 };
    t = await createResequencerTestApp(definition, options);
    slowed.watch(t.app);
    const events = 40;
    await holdAllButFirst(t, events);

    // 1 never comes: the sweep dead-letters the events held behind it, 20 ms each, past the
    // 100 ms the shutdown waits for it.
    const sweep = t.sweeper.sweep(Date.now() + 60_000);
    await eventually(() => onDlq().length >= 2, 'the drain dead-lettering');
    await t.close();
    await sweep;
    await sleep(events * 20);

    expect(slowed.sentAfterStop()).toBe(0);
    const moved = onDlq().length;
    expect(moved).toBeLessThan(events - 1);
    expect(await store.inspect({ scope: channel, key: 'T1' }, 1)).toMatchObject({
      next: events + 1,
      buffered: [],
      handOff: events - 1 - moved, // settled what it moved out; the rest waits
    });
    expect(t.handler.received).toEqual([]);

    // The key's next drain (the sweep of hand-off lists nobody drains) moves out the rest, once
    // each.
    t = await createResequencerTestApp(definition, options);
    await t.sweeper.sweep(Date.now() + 60_000);
    expect(onDlq()).toEqual(Array.from({ length: events - 1 }, (_, i) => i + 2));
    await t.close();
    await broker.close();
  });

  it('requeues the input of a drain the shutdown stopped, saying the resequencer is stopping', async () => {
    const broker = new InMemoryTransport();
    // Each confirm from the output takes 20 ms: the drain is still publishing at the stop.
    const transport = new FaultInjectingTransport(broker);
    transport.beforePublish = async ({ channel: to }) => {
      if (to === OUTPUT) await sleep(20);
    };
    t = await createResequencerTestApp({ channel, gap: GAP }, { transport });
    const resequencer = t.service.create({ channel: 'transfers.fed', output: OUTPUT, gap: GAP });
    const event = (seq: number) => ({
      body: Buffer.from(`T1#${seq}`),
      headers: { 'x-resequence-key': 'T1', 'x-resequence-seq': seq },
    });
    for (let seq = 2; seq <= 20; seq++) await resequencer.receive(event(seq));

    const received = resequencer.receive(event(1));
    await eventually(() => broker.peek(OUTPUT).length >= 2, 'the drain publishing');
    await t.close();

    await expect(received).resolves.toEqual({
      action: 'requeue',
      delayMs: 500,
      reason: 'key T1: the resequencer is stopping',
    });
    await broker.close();
  });

  describe('shutdown with a handler that does not return', () => {
    /** Closes `t`, telling whether it had closed within `ms`; the slow handler is then let go. */
    async function closesWithin(ms: number, release: () => void): Promise<boolean> {
      const closing = t.close().then(() => true);
      const outcome = await Promise.race([closing, sleep(ms).then(() => false)]);
      release();
      await closing;
      return outcome;
    }

    it('closes within shutdownTimeoutMs while a drain whose input was acked is in a handler', async () => {
      t = await createResequencerTestApp({ channel, gap: GAP }, { shutdownTimeoutMs: 300 });
      let release!: () => void;
      const slow = new Promise<void>((resolve) => (release = resolve));
      let slowStarted = false;
      t.handler.onCall = async (event) => {
        if (event.seq === 1) {
          // 2 comes while 1 is handled: the drain goes on to it after acking 1's input.
          await publishEvent(t.transport, channel, 'T1', 2);
          await sleep(200);
        }
        if (event.seq === 2) {
          slowStarted = true;
          await slow;
        }
      };
      await publishEvent(t.transport, channel, 'T1', 1);
      await eventually(() => slowStarted, 'the handler of 2 running');

      expect(await closesWithin(3_000, release)).toBe(true);
    });

    it("closes within shutdownTimeoutMs while the gap sweeper's drain is in a handler", async () => {
      t = await createResequencerTestApp(
        { channel, gap: { timeoutMs: 100, policy: 'skip' } },
        { shutdownTimeoutMs: 300, tuning: { sweepers: { gaps: { intervalMs: 50 } } } },
      );
      let release!: () => void;
      const slow = new Promise<void>((resolve) => (release = resolve));
      let slowStarted = false;
      t.handler.onCall = async (event) => {
        if (event.seq === 2) {
          slowStarted = true;
          await slow;
        }
      };
      await publishEvent(t.transport, channel, 'T1', 2); // 1 never comes: the sweeper skips it
      await eventually(() => slowStarted, '2 released by the sweeper, in its handler', 5_000);

      expect(await closesWithin(3_000, release)).toBe(true);
    });

    it("waits at shutdown for a sweep's drain in a handler slower than drain.waitMs, within shutdownTimeoutMs", async () => {
      t = await createResequencerTestApp(
        { channel, gap: { timeoutMs: 60_000, policy: 'skip' } },
        { shutdownTimeoutMs: 5_000, tuning: { drain: { waitMs: 50 } } },
      );
      t.handler.onCall = async () => {
        await sleep(400);
      };
      await publishEvent(t.transport, channel, 'T1', 2);
      await eventually(
        async () => (await t.service.buffered(channel, 'T1')).length === 1,
        '2 buffered',
      );
      // The sweep skips 1 and drains 2; the application stops while it waits for that drain.
      const sweeping = t.sweeper.sweep(Date.now() + 60_001);
      await sleep(10);
      await t.close();
      await sweeping;

      expect(t.handler.of('T1')).toEqual([2]);
    });
  });
});
