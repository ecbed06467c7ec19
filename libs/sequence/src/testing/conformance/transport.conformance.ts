import { randomBytes, randomUUID } from 'node:crypto';
import { InvalidHeaderError } from '../../core/errors/invalid-header.error';
import { MessageTooLargeError } from '../../core/errors/message-too-large.error';
import type { HeaderMap } from '../../core/headers';
import {
  headerBytes,
  MAX_PREFETCH,
  REQUEUE_COUNT_HEADER,
  type Disposition,
  type InboundMessage,
  type MessageHandler,
  type SubscribeOptions,
  type Subscription,
  type Transport,
} from '../../ports/transport.port';

export interface TransportHarness {
  /**
   * A connected transport. Give it a modest `maxMessageBytes` (a few MiB, at least 3 MiB): one
   * case publishes a message of exactly that size.
   */
  create(): Promise<Transport>;
  /** Closes it and cleans up; `transport.close()` when absent. */
  close?(transport: Transport): Promise<void>;
  /**
   * Whether every delivery carries `abandoned` (an `AbortSignal`): then the suite requires it.
   * Leave it unset for a transport that cannot tell when its deliveries can no longer be settled.
   */
  offersAbandoned?: boolean;
}

const ACK: Disposition = { action: 'ack' };
const SENTINEL = 'x-conformance-sentinel';

/**
 * The behaviour every {@link Transport} adapter must show. Each case uses channels of its own
 * (`conf.<uuid>`), so the suite can run against a shared broker.
 */
export function describeTransportConformance(adapterName: string, harness: TransportHarness): void {
  describe(`Transport conformance: ${adapterName}`, () => {
    let transport: Transport;
    let subscriptions: Subscription[];

    beforeEach(async () => {
      transport = await harness.create();
      subscriptions = [];
    });

    afterEach(async () => {
      await Promise.all(
        subscriptions.map((subscription) => subscription.close().catch(() => undefined)),
      );
      await (harness.close ? harness.close(transport) : transport.close());
    });

    const newChannel = (): string => `conf.${randomUUID()}`;

    async function subscribe(
      channel: string,
      handler: MessageHandler,
      options?: SubscribeOptions,
    ): Promise<Subscription> {
      const subscription = await transport.subscribe(channel, handler, options);
      subscriptions.push(subscription);
      return subscription;
    }

    /** Subscribes a handler that records every message and acks it. */
    async function collect(channel: string, options?: SubscribeOptions) {
      const received: InboundMessage[] = [];
      const subscription = await subscribe(
        channel,
        async (message) => {
          received.push(message);
          return ACK;
        },
        options,
      );
      return { received, subscription };
    }

    /**
     * What else a fresh subscriber finds in `channel`: subscribes, publishes a sentinel and returns
     * whatever arrived before it. Proves a message is gone without a fixed sleep.
     */
    async function leftoversIn(channel: string): Promise<InboundMessage[]> {
      const { received } = await collect(channel);
      await transport.publish(channel, Buffer.from('sentinel'), { [SENTINEL]: true });
      await eventually(() => received.some((m) => m.headers[SENTINEL] === true), 'the sentinel');
      return received.filter((m) => m.headers[SENTINEL] !== true);
    }

    it('answers ping while open, and refuses it once closed', async () => {
      await expect(transport.ping()).resolves.toBeUndefined();
      const other = await harness.create();
      await other.close();
      await expect(other.ping()).rejects.toThrow();
    });

    it('delivers the body byte-exact and header values with their types', async () => {
      const channel = newChannel();
      const body = Buffer.concat([Buffer.from([0, 255, 128, 1, 0]), Buffer.from('héllo ✓')]);
      const headers: HeaderMap = {
        'x-text': 'héllo wörld',
        'x-numeric-text': '42',
        'x-count': 42,
        'x-negative': -7,
        'x-zero': 0,
        'x-large': 4_294_967_295,
        'x-yes': true,
        'x-no': false,
      };
      const { received } = await collect(channel);
      await transport.publish(channel, body, headers);

      await eventually(() => received.length === 1, 'the message');
      const [message] = received;
      expect(message.channel).toBe(channel);
      expect(message.body.equals(body)).toBe(true);
      expect(message.redelivered).toBe(false);
      for (const [name, value] of Object.entries(headers)) {
        expect({ name, value: message.headers[name] }).toEqual({ name, value });
      }
    });

    it('delivers messages published before anyone subscribed', async () => {
      const channel = newChannel();
      for (const text of ['one', 'two', 'three']) {
        await transport.publish(channel, Buffer.from(text), {});
      }
      const { received } = await collect(channel);

      await eventually(() => received.length === 3, 'three messages');
      expect(received.map((m) => m.body.toString()).sort()).toEqual(['one', 'three', 'two']);
    });

    it('publishes with resend: false like any publish, several in flight at once, in order', async () => {
      const channel = newChannel();
      await transport.publish(channel, Buffer.from('declares'), {});
      await Promise.all(
        ['one', 'two', 'three'].map((text) =>
          transport.publish(channel, Buffer.from(text), {}, { resend: false }),
        ),
      );
      const { received } = await collect(channel);

      await eventually(() => received.length === 4, 'four messages');
      expect(received.map((m) => m.body.toString())).toEqual(['declares', 'one', 'two', 'three']);
    });

    it('removes an acknowledged message: it is never delivered again', async () => {
      const channel = newChannel();
      const { received, subscription } = await collect(channel);
      await transport.publish(channel, Buffer.from('once'), {});
      await eventually(() => received.length === 1, 'the message');
      await subscription.close();

      expect(await leftoversIn(channel)).toEqual([]);
      expect(received).toHaveLength(1);
    });

    it('redelivers a requeued message, flagged redelivered', async () => {
      const channel = newChannel();
      const deliveries: InboundMessage[] = [];
      await subscribe(channel, async (message) => {
        deliveries.push(message);
        return deliveries.length === 1 ? { action: 'requeue' } : ACK;
      });
      await transport.publish(channel, Buffer.from('again'), { 'x-n': 1 });

      await eventually(() => deliveries.length === 2, 'the redelivery');
      expect(deliveries.map((m) => m.redelivered)).toEqual([false, true]);
      expect(deliveries[1].body.toString()).toBe('again');
      expect(deliveries[1].headers['x-n']).toBe(1);
    });

    it('does not redeliver a message requeued with delayMs before the delay', async () => {
      const channel = newChannel();
      const delayMs = 400;
      const deliveredAt: number[] = [];
      await subscribe(channel, async () => {
        deliveredAt.push(performance.now());
        return deliveredAt.length === 1 ? { action: 'requeue', delayMs } : ACK;
      });
      await transport.publish(channel, Buffer.from('later'), {});

      await eventually(() => deliveredAt.length === 2, 'the delayed redelivery');
      // A little slack for timer granularity.
      expect(deliveredAt[1] - deliveredAt[0]).toBeGreaterThanOrEqual(delayMs - 15);
    });

    it('redelivers a message requeued with delayMs flagged redelivered, counting in x-requeue-count', async () => {
      const channel = newChannel();
      const body = randomBytes(64);
      const deliveries: InboundMessage[] = [];
      await subscribe(channel, async (message) => {
        deliveries.push(message);
        return deliveries.length < 3 ? { action: 'requeue', delayMs: 20 } : ACK;
      });
      await transport.publish(channel, body, { 'x-text': 'kept', 'x-n': 4 });

      await eventually(() => deliveries.length === 3, 'two delayed redeliveries');
      expect(deliveries.map((m) => m.redelivered)).toEqual([false, true, true]);
      expect(deliveries.map((m) => m.headers[REQUEUE_COUNT_HEADER])).toEqual([undefined, 1, 2]);
      for (const message of deliveries) {
        expect(message.body.equals(body)).toBe(true);
        expect(message.headers).toMatchObject({ 'x-text': 'kept', 'x-n': 4 });
      }
    });

    it('does not let a message always requeued with delayMs starve the one behind it', async () => {
      const channel = newChannel();
      let requeues = 0;
      const behind: InboundMessage[] = [];
      await transport.publish(channel, Buffer.from('back-pressured'), { 'x-role': 'stuck' });
      await transport.publish(channel, Buffer.from('behind'), { 'x-role': 'behind' });
      // One slot: while the first message is held for its delay, nothing else can be delivered.
      await subscribe(
        channel,
        async (message) => {
          if (message.headers['x-role'] !== 'stuck') {
            behind.push(message);
            return ACK;
          }
          requeues++;
          return { action: 'requeue', delayMs: 30 };
        },
        { prefetch: 1 },
      );

      await eventually(() => behind.length === 1, 'the message behind the back-pressured one');
      const requeuesThen = requeues;
      await eventually(() => requeues >= requeuesThen + 3, 'more requeues of the first message');
      // It was acked: the first message keeps coming back, the second never does.
      expect(behind.map((m) => [m.body.toString(), m.redelivered])).toEqual([['behind', false]]);
    });

    it('redelivers a message whose handler rejected', async () => {
      const channel = newChannel();
      const deliveries: InboundMessage[] = [];
      await subscribe(channel, async (message) => {
        deliveries.push(message);
        if (deliveries.length === 1) throw new Error('handler failure (expected by the test)');
        return ACK;
      });
      await transport.publish(channel, Buffer.from('retry me'), {});

      await eventually(() => deliveries.length === 2, 'the redelivery');
      expect(deliveries.map((m) => m.redelivered)).toEqual([false, true]);
    });

    it('redelivers a message whose handler threw synchronously', async () => {
      const channel = newChannel();
      const deliveries: InboundMessage[] = [];
      const handler = ((message: InboundMessage) => {
        deliveries.push(message);
        if (deliveries.length === 1) throw new Error('handler failure (expected by the test)');
        return Promise.resolve(ACK);
      }) as MessageHandler;
      await subscribe(channel, handler);
      await transport.publish(channel, Buffer.from('retry me'), {});

      await eventually(() => deliveries.length === 2, 'the redelivery');
      expect(deliveries[1].redelivered).toBe(true);
    });

    it('dead-letters to transport.deadLetterChannel(channel) by default, with body and headers kept, plus x-death-reason', async () => {
      const channel = newChannel();
      const body = randomBytes(1024);
      const headers: HeaderMap = { 'x-text': 'kept', 'x-count': 3, 'x-flag': true };
      const reason = 'crc-mismatch: fragment 3 of sequence s-1';
      const deadLetterChannel = transport.deadLetterChannel(channel);
      expect(deadLetterChannel).not.toBe(channel);
      const dead = await collect(deadLetterChannel);
      const original = await subscribe(channel, async () => ({ action: 'dead-letter', reason }));
      await transport.publish(channel, body, headers);

      await eventually(() => dead.received.length === 1, 'the dead letter');
      const [letter] = dead.received;
      expect(letter.body.equals(body)).toBe(true);
      expect(letter.headers).toMatchObject({ ...headers, 'x-death-reason': reason });
      await original.close();
      expect(await leftoversIn(channel)).toEqual([]);
    });

    it('dead-letters a message requeued with delayMs without its x-requeue-count, so that it can be republished as it is', async () => {
      const channel = newChannel();
      const dead = await collect(transport.deadLetterChannel(channel));
      let deliveries = 0;
      const original = await subscribe(channel, async () =>
        ++deliveries < 3
          ? { action: 'requeue', delayMs: 20 }
          : { action: 'dead-letter', reason: 'store-unavailable: gave up' },
      );
      await transport.publish(channel, randomBytes(16), { 'x-text': 'kept' });

      await eventually(() => dead.received.length === 1, 'the dead letter');
      expect(dead.received[0].headers).toEqual({
        'x-text': 'kept',
        'x-death-reason': 'store-unavailable: gave up',
      });
      await original.close();
    });

    it("moves a message a dead-letter channel's subscriber dead-letters on to that channel's own dead-letter channel", async () => {
      // Nothing the transport does by itself dead-letters out of a dead-letter channel; a
      // subscriber's own verdict there is kept, not dropped.
      const deadLetterChannel = transport.deadLetterChannel(newChannel());
      const onward = transport.deadLetterChannel(deadLetterChannel);
      expect(onward).not.toBe(deadLetterChannel);
      const dead = await collect(onward);
      await subscribe(deadLetterChannel, async () => ({
        action: 'dead-letter',
        reason: 'no-handler: nothing takes it',
      }));
      await transport.publish(deadLetterChannel, Buffer.from('refused twice'), {
        'x-death-reason': 'handler-failed: first',
      });

      await eventually(() => dead.received.length === 1, 'the onward dead letter');
      expect(dead.received[0].body.toString()).toBe('refused twice');
      expect(dead.received[0].headers).toMatchObject({
        'x-death-reason': 'no-handler: nothing takes it',
      });
    });

    it('dead-letters to the deadLetterChannel given at subscribe', async () => {
      const channel = newChannel();
      const custom = `${channel}.custom-dead`;
      const dead = await collect(custom);
      const reason = 'handler-failed: gave up';
      await subscribe(channel, async () => ({ action: 'dead-letter', reason }), {
        deadLetterChannel: custom,
      });
      await transport.publish(channel, Buffer.from('to custom'), { 'x-n': 5 });

      await eventually(() => dead.received.length === 1, 'the dead letter');
      expect(dead.received[0].body.toString()).toBe('to custom');
      expect(dead.received[0].headers).toMatchObject({ 'x-n': 5, 'x-death-reason': reason });
      expect(await leftoversIn(transport.deadLetterChannel(channel))).toEqual([]);
    });

    it("hands a closed subscriber's unsettled message to another subscriber", async () => {
      const channel = newChannel();
      const held: Array<(disposition: Disposition) => void> = [];
      const first = await subscribe(
        channel,
        () => new Promise<Disposition>((resolve) => held.push(resolve)),
      );
      await transport.publish(channel, Buffer.from('unsettled'), { 'x-n': 9 });
      await eventually(() => held.length === 1, 'the first delivery');

      const second = await collect(channel);
      await first.close();
      await eventually(() => second.received.length === 1, 'the redelivery to the other');
      expect(second.received[0].body.toString()).toBe('unsettled');
      expect(second.received[0].headers['x-n']).toBe(9);
      expect(second.received[0].redelivered).toBe(true);

      // The closed subscriber's late verdict changes nothing, and the channel still works.
      held[0]({ action: 'requeue' });
      await transport.publish(channel, Buffer.from('after'), {});
      await eventually(() => second.received.length === 2, 'the next message');
      expect(second.received[1].body.toString()).toBe('after');
    });

    it("aborts an unsettled delivery's abandoned signal once its subscription closes, where offered", async () => {
      const channel = newChannel();
      let held: InboundMessage | undefined;
      // Never settled: the close hands it back.
      const subscription = await subscribe(channel, (message) => {
        held = message;
        return new Promise<Disposition>(() => undefined);
      });
      await transport.publish(channel, Buffer.from('held'), {});
      await eventually(() => held !== undefined, 'the delivery');
      const abandoned = held!.abandoned;
      if (harness.offersAbandoned) expect(abandoned).toBeInstanceOf(AbortSignal);
      if (abandoned === undefined) return; // the transport cannot tell
      expect(abandoned.aborted).toBe(false);
      await subscription.close();
      expect(abandoned.aborted).toBe(true);
    });

    it('shares a channel between competing subscribers; each message goes to one', async () => {
      const channel = newChannel();
      const count = 20;
      const slowCollector = () => {
        const received: number[] = [];
        const handler: MessageHandler = async (message) => {
          await sleep(10);
          received.push(Number(message.headers['x-index']));
          return ACK;
        };
        return { received, handler };
      };
      const a = slowCollector();
      const b = slowCollector();
      await subscribe(channel, a.handler, { prefetch: 1 });
      await subscribe(channel, b.handler, { prefetch: 1 });
      for (let index = 0; index < count; index++) {
        await transport.publish(channel, Buffer.from(`m${index}`), { 'x-index': index });
      }

      await eventually(() => a.received.length + b.received.length >= count, 'every message');
      const all = [...a.received, ...b.received].sort((x, y) => x - y);
      expect(all).toEqual(Array.from({ length: count }, (_, index) => index));
      expect(a.received.length).toBeGreaterThan(0);
      expect(b.received.length).toBeGreaterThan(0);
    });

    it('never has more than prefetch unsettled messages in one subscriber', async () => {
      const channel = newChannel();
      const prefetch = 3;
      const total = 10;
      const waiting: Array<() => void> = [];
      let holding = true;
      let inHandler = 0;
      let mostInHandler = 0;
      let done = 0;
      await subscribe(
        channel,
        async () => {
          inHandler++;
          mostInHandler = Math.max(mostInHandler, inHandler);
          if (holding) await new Promise<void>((resolve) => waiting.push(resolve));
          inHandler--;
          done++;
          return ACK;
        },
        { prefetch },
      );
      for (let index = 0; index < total; index++) {
        await transport.publish(channel, Buffer.from(`m${index}`), {});
      }

      await eventually(() => waiting.length === prefetch, `${prefetch} held messages`);
      await sleep(200); // room for a wrong adapter to deliver more
      expect(inHandler).toBe(prefetch);

      holding = false;
      waiting.forEach((release) => release());
      await eventually(() => done === total, 'every message');
      expect(mostInHandler).toBe(prefetch);
    });

    it('refuses a prefetch RabbitMQ cannot take (0, or above 65535), opening no subscription', async () => {
      const channel = newChannel();
      for (const prefetch of [0, MAX_PREFETCH + 1]) {
        await expect(transport.subscribe(channel, async () => ACK, { prefetch })).rejects.toThrow(
          /prefetch/,
        );
      }
      await transport.publish(channel, Buffer.from('kept'), {});
      const { received } = await collect(channel, { prefetch: MAX_PREFETCH });
      await eventually(() => received.length === 1, 'the message, to the one subscription');
    });

    it('refuses headers RabbitMQ cannot encode with InvalidHeaderError, sending nothing', async () => {
      const channel = newChannel();
      const refused: HeaderMap[] = [
        { ratio: 2 ** 50 + 0.5 }, // sent as a 64-bit integer: the fraction would be lost
        { big: 'x'.repeat(61 * 1024) }, // past amqplib's scratch buffer for properties
        { retries: Number.NaN },
      ];
      for (const headers of refused) {
        await expect(transport.publish(channel, Buffer.from('m'), headers)).rejects.toBeInstanceOf(
          InvalidHeaderError,
        );
      }
      expect(await leftoversIn(channel)).toEqual([]);
    });

    it('refuses a publish timeoutMs that is not a timer range of milliseconds, sending nothing', async () => {
      const channel = newChannel();
      for (const timeoutMs of [0, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
        await expect(
          transport.publish(channel, Buffer.from('m'), {}, { timeoutMs }),
        ).rejects.toBeInstanceOf(RangeError);
      }
      expect(await leftoversIn(channel)).toEqual([]);
    });

    it('rejects a message larger than maxMessageBytes with MessageTooLargeError', async () => {
      const channel = newChannel();
      const headers: HeaderMap = { 'x-text': 'some header' };
      const fits = transport.maxMessageBytes - headerBytes(headers);

      await expect(
        transport.publish(channel, Buffer.alloc(fits), headers),
      ).resolves.toBeUndefined();
      const tooLarge = transport.publish(channel, Buffer.alloc(fits + 1), headers);
      await expect(tooLarge).rejects.toBeInstanceOf(MessageTooLargeError);
      await expect(tooLarge).rejects.toMatchObject({
        channel,
        bytes: transport.maxMessageBytes + 1,
        maxMessageBytes: transport.maxMessageBytes,
      });
    });

    it('carries a 2 MiB binary body byte-exact', async () => {
      const channel = newChannel();
      const body = randomBytes(2 * 1024 * 1024);
      const { received } = await collect(channel);
      await transport.publish(channel, body, { 'x-size': body.length });

      await eventually(() => received.length === 1, 'the message');
      expect(received[0].body.length).toBe(body.length);
      expect(received[0].body.equals(body)).toBe(true);
    });

    it('keeps the published bytes when the caller reuses its buffer after publish', async () => {
      const channel = newChannel();
      const buffer = Buffer.from('original');
      await transport.publish(channel, buffer, {});
      buffer.write('modified');
      const { received } = await collect(channel);

      await eventually(() => received.length === 1, 'the message');
      expect(received[0].body.toString()).toBe('original');
    });

    describe('releaseBody, where the transport offers it', () => {
      /** Publishes one message and returns the first delivery's message, without settling it. */
      async function firstDelivery(
        channel: string,
        body: Buffer,
        then: (message: InboundMessage, deliveries: number) => Disposition,
      ): Promise<InboundMessage> {
        let deliveries = 0;
        let first: InboundMessage | undefined;
        await subscribe(channel, async (message) => {
          deliveries++;
          first ??= message;
          return then(message, deliveries);
        });
        await transport.publish(channel, body, { 'x-text': 'kept' });
        await eventually(() => first !== undefined, 'the delivery');
        return first!;
      }

      it('empties the body it released, and an ack still removes the message', async () => {
        const channel = newChannel();
        let offered: boolean | undefined;
        let after: number | undefined;
        await firstDelivery(channel, randomBytes(4096), (message) => {
          offered = message.releaseBody !== undefined;
          message.releaseBody?.();
          after = message.body.length;
          return ACK;
        });
        if (offered) expect(after).toBe(0);
        else expect(after).toBe(4096);
        await subscriptions.pop()!.close();
        expect(await leftoversIn(channel)).toEqual([]);
      });

      it('gives a large body up once however often it is released: later bodies stay whole', async () => {
        // Large enough for the bodies a transport's socket tricks receive in place and reuse.
        const bodies = [1, 2, 3, 4].map(() => randomBytes(300 * 1024));
        const channel = newChannel();
        const received: InboundMessage[] = [];
        const kept: Buffer[] = [];
        await subscribe(channel, async (message) => {
          received.push(message);
          if (received.length === 1) message.releaseBody?.();
          else kept.push(message.body);
          return ACK;
        });
        for (const body of bodies.slice(0, 3)) await transport.publish(channel, body, {});
        await eventually(() => received.length === 3, 'three deliveries');
        // Again, once later bodies may have been written into the memory it gave up.
        received[0].releaseBody?.();
        await transport.publish(channel, bodies[3], {});
        await eventually(() => received.length === 4, 'the fourth delivery');

        expect(kept.map((body, index) => body.equals(bodies[index + 1]))).toEqual([
          true,
          true,
          true,
        ]);
      });

      it('dead-letters a released message with the body the disposition gives back', async () => {
        const channel = newChannel();
        const body = randomBytes(4096);
        const dead = await collect(transport.deadLetterChannel(channel));
        await firstDelivery(channel, body, (message) => {
          message.releaseBody?.();
          return { action: 'dead-letter', reason: 'bad-fragment: given back', body };
        });

        await eventually(() => dead.received.length === 1, 'the dead letter');
        expect(dead.received[0].body.equals(body)).toBe(true);
        expect(dead.received[0].headers).toMatchObject({
          'x-text': 'kept',
          'x-death-reason': 'bad-fragment: given back',
        });
      });

      it('never loses a released message dead-lettered without its body: dead-lettered whole, or delivered again whole', async () => {
        const channel = newChannel();
        const body = randomBytes(4096);
        const dead = await collect(transport.deadLetterChannel(channel));
        const again: InboundMessage[] = [];
        await firstDelivery(channel, body, (message, deliveries) => {
          if (deliveries > 1) {
            again.push(message);
            return ACK;
          }
          message.releaseBody?.();
          return { action: 'dead-letter', reason: 'bad-fragment: body not given' };
        });

        await eventually(() => dead.received.length + again.length > 0, 'the message back');
        const [back] = [...dead.received, ...again];
        expect(back.body.equals(body)).toBe(true);
        expect(back.headers['x-text']).toBe('kept');
      });
    });
  });
}

/** Polls `check` until it holds; fails naming `what` after `timeoutMs`. */
export async function eventually(
  check: () => boolean,
  what: string,
  timeoutMs = 10_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!check()) {
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(5);
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
