import { InMemoryTransport } from 'nest-sequence';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  eventually,
  makeFragments,
  publishAll,
} from '../support/sequence-test-app';

describe('guarantees: graceful shutdown', () => {
  it('lets a delivery in progress finish before closing, so its sequence is not redelivered', async () => {
    const channel = 'guarantees.shutdown.in-flight';
    const t = await createSequenceTestApp(channel, {
      sequence: { retentionMs: 60_000 },
    });
    let release: () => void = () => undefined;
    t.handler.onCall = () => new Promise<void>((resolve) => (release = resolve));
    const payload = bytes(2_500, 91);
    await publishAll(t.transport, channel, makeFragments('in-flight', payload, 1_000));
    await eventually(() => t.handler.calls === 1, 'the handler running');

    let closed = false;
    const closing = t.close().then(() => (closed = true));
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(closed).toBe(false); // shutdown waits for the delivery
    release();
    await closing;

    expect(t.handler.of('in-flight')).toHaveLength(1);
    expect(t.handler.of('in-flight')[0].bytes.equals(payload)).toBe(true);
    expect(t.transport.depth(channel)).toBe(0); // acked, not handed back
    expect(deadLetters(t.transport, channel)).toHaveLength(0);
  });

  it('stops waiting after shutdownTimeoutMs and hands the fragment back', async () => {
    const channel = 'guarantees.shutdown.timeout';
    const transport = (await createSequenceTestApp('unused')).transport;
    const t = await createSequenceTestApp(channel, { transport, shutdownTimeoutMs: 50 });
    t.handler.onCall = () => new Promise<void>(() => undefined); // never finishes
    await publishAll(t.transport, channel, makeFragments('stuck', bytes(1_500, 92), 1_000));
    await eventually(() => t.handler.calls === 1, 'the handler running');

    await t.close();

    expect(t.transport.depth(channel)).toBe(1); // the completing fragment is back in the queue
  });

  it('holds a fragment that arrives during the drain instead of redelivering it in a loop', async () => {
    const channel = 'guarantees.shutdown.arrival-during-drain';
    const transport = new InMemoryTransport();
    let deliveries = 0;
    const subscribe = transport.subscribe.bind(transport);
    transport.subscribe = (name, handler, options) =>
      subscribe(
        name,
        (message) => {
          if (name === channel && message.headers['x-sequence-id'] === 'late') deliveries++;
          return handler(message);
        },
        options,
      );
    // 1,000-byte fragments: a maxFragmentBytes to match keeps the prefetch at 16, so the late
    // fragment has a slot while the running handler holds one.
    const t = await createSequenceTestApp(channel, {
      transport,
      handler: { maxFragmentBytes: 64 * 1024 },
    });
    let release: () => void = () => undefined;
    t.handler.onCall = () => new Promise<void>((resolve) => (release = resolve));
    await publishAll(transport, channel, makeFragments('running', bytes(1_500, 93), 1_000));
    await eventually(() => t.handler.calls === 1, 'the handler running');

    const closing = t.close();
    await publishAll(
      transport,
      channel,
      makeFragments('late', bytes(2_500, 94), 1_000).slice(0, 1),
    );
    await new Promise((resolve) => setTimeout(resolve, 100));
    release();
    await closing;

    expect(deliveries).toBe(1); // delivered once, held until the subscription closed
    expect(transport.depth(channel)).toBe(1); // and handed back to the queue
    expect(deadLetters(transport, channel)).toHaveLength(0);
  });

  it('calls a failing handler no more once the drain is over, and hands its sequence back', async () => {
    const channel = 'guarantees.shutdown.retry-backoff';
    const transport = new InMemoryTransport();
    const t = await createSequenceTestApp(channel, {
      transport,
      shutdownTimeoutMs: 100,
      handler: { handlerRetry: { attempts: 3, baseDelayMs: 1_000, maxDelayMs: 1_000 } },
    });
    let closed = false;
    const callsAfterClose: number[] = [];
    t.handler.onCall = async () => {
      if (closed) callsAfterClose.push(t.handler.calls);
      throw new Error('downstream unavailable');
    };
    await publishAll(transport, channel, makeFragments('retrying', bytes(1_500, 95), 1_000));
    await eventually(() => t.handler.calls === 1, 'the first attempt failed');

    // The retry waits 500-1,000 ms; the drain gives up after 100.
    await t.close();
    closed = true;
    await new Promise((resolve) => setTimeout(resolve, 1_200));

    expect(callsAfterClose).toEqual([]);
    expect(t.handler.calls).toBe(1);
    expect(transport.depth(channel)).toBe(1); // the completing fragment, for the next delivery
    expect(deadLetters(transport, channel)).toHaveLength(0);
  });
});
