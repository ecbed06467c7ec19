import {
  eventually,
  describeTransportConformance,
} from '../../../testing/conformance/transport.conformance';
import { describeReplyChannelConformance } from '../../../testing/conformance/reply-channel.conformance';
import { describePartitionedChannelConformance } from '../../../testing/conformance/partitioned-channel.conformance';
import { Logger } from '@nestjs/common';
import { MessageTooLargeError } from '../../../core/errors/message-too-large.error';
import { PublishRejectedError } from '../../../core/errors/publish-rejected.error';
import type { Disposition, InboundMessage } from '../../../ports/transport.port';
import { InMemoryTransport } from './in-memory.transport';

describeTransportConformance('in-memory', {
  create: async () => new InMemoryTransport({ maxMessageBytes: 4 * 1024 * 1024 }),
  offersAbandoned: true,
});

describeReplyChannelConformance('in-memory', {
  create: async () => new InMemoryTransport({ maxMessageBytes: 4 * 1024 * 1024 }),
  publishToClosed: 'rejects',
});

describePartitionedChannelConformance('in-memory', {
  create: async () => new InMemoryTransport(),
});

describe('InMemoryTransport', () => {
  let transport: InMemoryTransport;

  beforeEach(() => {
    transport = new InMemoryTransport();
  });

  afterEach(async () => {
    await transport.close();
  });

  it('defaults maxMessageBytes to 16 MiB', async () => {
    expect(transport.name).toBe('in-memory');
    expect(transport.maxMessageBytes).toBe(16 * 1024 * 1024);
    await expect(
      transport.publish('big', Buffer.alloc(16 * 1024 * 1024 + 1), {}),
    ).rejects.toBeInstanceOf(MessageTooLargeError);
  });

  it('never runs a handler inside publish', async () => {
    const received: InboundMessage[] = [];
    await transport.subscribe('orders', async (message) => {
      received.push(message);
      return { action: 'ack' };
    });
    const published = transport.publish('orders', Buffer.from('a'), {});
    expect(received).toHaveLength(0);
    await published;
    expect(received).toHaveLength(0);

    await transport.whenIdle();
    expect(received).toHaveLength(1);
  });

  it('delivers one channel in publish order to a single subscriber', async () => {
    const bodies: string[] = [];
    for (let index = 0; index < 50; index++) {
      await transport.publish('fifo', Buffer.from(String(index)), {});
    }
    await transport.subscribe('fifo', async (message) => {
      bodies.push(message.body.toString());
      return { action: 'ack' };
    });

    await transport.whenIdle();
    expect(bodies).toEqual(Array.from({ length: 50 }, (_, index) => String(index)));
  });

  it('depth, peek and take show what waits in a channel nobody consumes', async () => {
    await transport.publish('parked', Buffer.from('one'), { 'x-n': 1 });
    await transport.publish('parked', Buffer.from('two'), { 'x-n': 2 });

    expect(transport.depth('parked')).toBe(2);
    const peeked = transport.peek('parked');
    expect(peeked.map((m) => [m.body.toString(), m.headers['x-n'], m.redelivered])).toEqual([
      ['one', 1, false],
      ['two', 2, false],
    ]);
    peeked[0].body.write('XXX');
    expect(transport.peek('parked')[0].body.toString()).toBe('one');
    expect(transport.depth('parked')).toBe(2);

    expect(transport.take('parked').map((m) => m.body.toString())).toEqual(['one', 'two']);
    expect(transport.depth('parked')).toBe(0);
    expect(transport.take('unknown')).toEqual([]);
  });

  it('counts unsettled messages, and whenIdle waits for them to settle', async () => {
    const release: Array<(disposition: Disposition) => void> = [];
    await transport.subscribe('held', () => new Promise((resolve) => release.push(resolve)));
    await transport.publish('held', Buffer.from('a'), {});
    await transport.publish('held', Buffer.from('b'), {});
    await eventually(() => release.length === 2, 'two deliveries');
    expect(transport.unsettled('held')).toBe(2);
    expect(transport.depth('held')).toBe(0);

    let idle = false;
    const whenIdle = transport.whenIdle().then(() => (idle = true));
    release[0]({ action: 'ack' });
    await new Promise((resolve) => setImmediate(resolve));
    expect(idle).toBe(false);
    expect(transport.unsettled('held')).toBe(1);

    release[1]({ action: 'ack' });
    await whenIdle;
    expect(transport.unsettled('held')).toBe(0);
  });

  it('dead-letters to <channel>.dlq by default', () => {
    expect(transport.deadLetterChannel('orders')).toBe('orders.dlq');
  });

  /**
   * Publishes `a` then `b`, subscribes with one slot, and returns the deliveries in order (`*`
   * marks a redelivery).
   */
  async function deliveryOrder(answer: (count: number) => Promise<Disposition>): Promise<string[]> {
    const order: string[] = [];
    await transport.publish('order', Buffer.from('a'), {});
    await transport.publish('order', Buffer.from('b'), {});
    await transport.subscribe(
      'order',
      async (message) => {
        order.push(`${message.body.toString()}${message.redelivered ? '*' : ''}`);
        return answer(order.length);
      },
      { prefetch: 1 },
    );
    await transport.whenIdle();
    return order;
  }

  it('puts a plain requeue back at the head, as a broker does: it is delivered next', async () => {
    const order = await deliveryOrder(async (count) =>
      count === 1 ? { action: 'requeue' } : { action: 'ack' },
    );
    expect(order).toEqual(['a', 'a*', 'b']);
  });

  it('puts a message whose handler threw back at the head', async () => {
    const order = await deliveryOrder(async (count) => {
      if (count === 1) throw new Error('handler failure (expected by the test)');
      return { action: 'ack' };
    });
    expect(order).toEqual(['a', 'a*', 'b']);
  });

  it('puts a message requeued with delayMs at the tail, behind the messages queued meanwhile', async () => {
    const order: string[] = [];
    for (const text of ['a', 'b', 'c']) await transport.publish('tail', Buffer.from(text), {});
    await transport.subscribe(
      'tail',
      async (message) => {
        const text = message.body.toString();
        order.push(`${text}${message.redelivered ? '*' : ''}`);
        if (text === 'a' && !message.redelivered) return { action: 'requeue', delayMs: 10 };
        // 'b' is still in the handler when the delay ends: 'c' is queued, 'a' must go behind it.
        if (text === 'b') await new Promise((resolve) => setTimeout(resolve, 60));
        return { action: 'ack' };
      },
      { prefetch: 1 },
    );

    await transport.whenIdle();
    expect(order).toEqual(['a', 'b', 'c', 'a*']);
  });

  it('whenIdle waits for a delayed requeue and its redelivery', async () => {
    const deliveries: boolean[] = [];
    await transport.subscribe('delayed', async (message) => {
      deliveries.push(message.redelivered);
      return deliveries.length === 1 ? { action: 'requeue', delayMs: 50 } : { action: 'ack' };
    });
    await transport.publish('delayed', Buffer.from('x'), {});

    await transport.whenIdle();
    expect(deliveries).toEqual([false, true]);
  });

  it('whenIdle ignores messages in channels nobody consumes (such as dead letters)', async () => {
    await transport.subscribe('work', async () => ({ action: 'dead-letter', reason: 'bad: test' }));
    await transport.publish('work', Buffer.from('x'), { 'x-n': 1 });

    await transport.whenIdle();
    expect(transport.peek('work.dlq').map((m) => m.headers)).toEqual([
      { 'x-n': 1, 'x-death-reason': 'bad: test' },
    ]);
  });

  it('treats a handler result that is not a disposition as a requeue', async () => {
    const deliveries: boolean[] = [];
    await transport.subscribe('odd', (async (message: InboundMessage) => {
      deliveries.push(message.redelivered);
      return deliveries.length === 1 ? undefined : { action: 'ack' };
    }) as () => Promise<Disposition>);
    await transport.publish('odd', Buffer.from('x'), {});

    await transport.whenIdle();
    expect(deliveries).toEqual([false, true]);
  });

  it('rejects publish and subscribe after close, and closes twice without error', async () => {
    await transport.close();
    await transport.close();

    await expect(transport.publish('late', Buffer.from('x'), {})).rejects.toThrow(/closed/);
    await expect(transport.subscribe('late', async () => ({ action: 'ack' }))).rejects.toThrow(
      /closed/,
    );
  });

  it('close hands unsettled and delayed messages back to their queue and stops delivery', async () => {
    let calls = 0;
    await transport.subscribe('stop', async () => {
      calls++;
      return { action: 'requeue', delayMs: 60_000 };
    });
    await transport.publish('stop', Buffer.from('x'), {});
    await eventually(() => calls === 1, 'the delivery');
    await eventually(() => transport.unsettled('stop') === 0, 'the settlement');

    await transport.close();
    await transport.whenIdle();
    expect(
      transport.peek('stop').map((m) => [m.redelivered, m.headers['x-requeue-count']]),
    ).toEqual([[true, 1]]);
    expect(calls).toBe(1);
  });

  it('hands a partition taken over its unsettled messages in publish order, one requeued too', async () => {
    const partition = { index: 0, count: 1 };
    const seen: string[] = [];
    let requeued = false;
    const first = await transport.subscribe(
      'p',
      async (message: InboundMessage): Promise<Disposition> => {
        const body = message.body.toString();
        seen.push(body);
        if (body === 'm1' && !requeued) {
          requeued = true;
          return { action: 'requeue' };
        }
        return new Promise<Disposition>(() => undefined); // held unsettled
      },
      { partitions: 1, prefetch: 3 },
    );
    for (const body of ['m1', 'm2', 'm3']) {
      await transport.publish('p', Buffer.from(body), {}, { partition });
    }
    await eventually(() => seen.length === 4, 'm1 twice, m2 and m3');
    const taken: string[] = [];
    await transport.subscribe(
      'p',
      async (message: InboundMessage): Promise<Disposition> => {
        taken.push(message.body.toString());
        return { action: 'ack' };
      },
      { partitions: 1, prefetch: 3 },
    );
    await first.close();
    await transport.whenIdle();

    expect(seen).toEqual(['m1', 'm2', 'm3', 'm1']);
    expect(taken).toEqual(['m1', 'm2', 'm3']);
  });

  it('rejects prefetch below 1', async () => {
    await expect(
      transport.subscribe('x', async () => ({ action: 'ack' }), { prefetch: 0 }),
    ).rejects.toThrow(RangeError);
  });

  describe('reply channels', () => {
    afterEach(() => jest.restoreAllMocks());

    it('logs a warning naming the reason when it drops a dead-lettered reply', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      const replies = await transport.openReplyChannel(async () => ({
        action: 'dead-letter',
        reason: 'unreadable reply',
      }));
      await transport.publish(replies.channel, Buffer.from('x'), {});
      await transport.whenIdle();

      expect(warn).toHaveBeenCalledWith(expect.stringContaining(replies.channel));
      expect(warn).toHaveBeenCalledWith(expect.stringContaining('unreadable reply'));
      expect(transport.depth(transport.deadLetterChannel(replies.channel))).toBe(0);
      await replies.close();
    });

    it('removes a closed reply channel with the replies it held, delayed requeues included', async () => {
      let calls = 0;
      const replies = await transport.openReplyChannel(async () => {
        calls++;
        return { action: 'requeue', delayMs: 20 };
      });
      await transport.publish(replies.channel, Buffer.from('held'), {});
      await eventually(
        () => calls >= 1 && transport.unsettled(replies.channel) === 0,
        'the delayed requeue',
      );
      await replies.close();

      await transport.whenIdle();
      expect(transport.depth(replies.channel)).toBe(0);
      await expect(
        transport.publish(replies.channel, Buffer.from('late'), {}),
      ).rejects.toBeInstanceOf(PublishRejectedError);
    });

    it('rejects a publish to a reply channel name it never opened', async () => {
      await expect(
        transport.publish('nseq.reply.never-opened', Buffer.from('x'), {}),
      ).rejects.toBeInstanceOf(PublishRejectedError);
    });
  });
});

describe('InMemoryTransport dead letters', () => {
  const body = (n: number, size = 10) => Buffer.alloc(size, n);
  const bodies = (messages: InboundMessage[]) => messages.map((message) => message.body[0]);

  it('keeps at most maxDeadLetters per dead-letter channel, dropping the oldest and counting them', async () => {
    const transport = new InMemoryTransport({ maxDeadLetters: 3 });
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      for (let n = 1; n <= 5; n++) await transport.publish('orders.dlq', body(n), {});
      expect(bodies(transport.peek('orders.dlq'))).toEqual([3, 4, 5]);
      expect(transport.droppedDeadLetters()).toBe(2);
      expect(warn).toHaveBeenCalledTimes(1);
      // Other channels are the broker's work queues: never trimmed.
      for (let n = 1; n <= 5; n++) await transport.publish('orders', body(n), {});
      expect(transport.depth('orders')).toBe(5);
    } finally {
      warn.mockRestore();
      await transport.close();
    }
  });

  it('keeps at most maxDeadLetterBytes, and bounds a subscription’s own dead-letter channel', async () => {
    const transport = new InMemoryTransport({ maxDeadLetterBytes: 2_500 });
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      await transport.subscribe(
        'work',
        () => Promise.resolve<Disposition>({ action: 'dead-letter', reason: 'no' }),
        { deadLetterChannel: 'parked' },
      );
      for (let n = 1; n <= 4; n++) await transport.publish('work', body(n, 1_000), {});
      await transport.whenIdle();
      const kept = transport.peek('parked');
      expect(kept.length).toBeLessThan(4);
      expect(kept.reduce((sum, message) => sum + message.body.length, 0)).toBeLessThanOrEqual(
        2_500,
      );
      expect(bodies(kept)).toEqual([4, 3, 2, 1].slice(0, kept.length).reverse());
      expect(transport.droppedDeadLetters()).toBe(4 - kept.length);
    } finally {
      warn.mockRestore();
      await transport.close();
    }
  });

  it('refuses bounds that are not positive integers', () => {
    expect(() => new InMemoryTransport({ maxDeadLetters: 0 })).toThrow(/maxDeadLetters/);
    expect(() => new InMemoryTransport({ maxDeadLetterBytes: 1.5 })).toThrow(/maxDeadLetterBytes/);
  });
});
