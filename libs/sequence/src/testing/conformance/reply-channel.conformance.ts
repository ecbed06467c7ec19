import { randomBytes } from 'node:crypto';
import { MessageTooLargeError } from '../../core/errors/message-too-large.error';
import { PublishRejectedError } from '../../core/errors/publish-rejected.error';
import type { HeaderMap } from '../../core/headers';
import {
  headerBytes,
  MAX_PREFETCH,
  REQUEUE_COUNT_HEADER,
  type Disposition,
  type InboundMessage,
  type MessageHandler,
  type ReplyChannelOptions,
  type Subscription,
  type Transport,
} from '../../ports/transport.port';
import { eventually, type TransportHarness } from './transport.conformance';

/**
 * As {@link TransportHarness}, for a transport that defines `openReplyChannel`. Give it a modest
 * `maxMessageBytes` (a few MiB): one case publishes a reply of exactly that size.
 */
export interface ReplyChannelHarness extends TransportHarness {
  /**
   * What a publish to a closed reply channel does on this transport, as its documentation says:
   * `rejects` with `PublishRejectedError`, or `resolves` (the reply is stored and discarded).
   */
  readonly publishToClosed: 'rejects' | 'resolves';
  /**
   * True when two transports of `create()` reach one broker, as two processes would: replies are
   * then published by a second transport, the way a responder in another process sends them.
   * @default false
   */
  readonly sharedBroker?: boolean;
}

const ACK: Disposition = { action: 'ack' };
const SENTINEL = 'x-conformance-sentinel';
/** A timeout for publishes that must settle (either way) well within the test's own. */
const SETTLE_TIMEOUT_MS = 5_000;

/**
 * The behaviour of every {@link Transport} that defines `openReplyChannel` (see its contract).
 * Run it next to `describeTransportConformance` for transports that route replies.
 */
export function describeReplyChannelConformance(
  adapterName: string,
  harness: ReplyChannelHarness,
): void {
  describe(`Reply channel conformance: ${adapterName}`, () => {
    let transport: Transport;
    /** Where replies are published from: a second transport on the broker, when there is one. */
    let responder: Transport;
    let subscriptions: Subscription[];

    beforeEach(async () => {
      transport = await harness.create();
      responder = harness.sharedBroker ? await harness.create() : transport;
      subscriptions = [];
    });

    afterEach(async () => {
      await Promise.all(
        subscriptions.map((subscription) => subscription.close().catch(() => undefined)),
      );
      for (const each of new Set([responder, transport])) {
        await (harness.close ? harness.close(each) : each.close());
      }
    });

    async function open(
      handler: MessageHandler,
      options?: ReplyChannelOptions,
      on: Transport = transport,
    ): Promise<Subscription> {
      if (!on.openReplyChannel) throw new Error(`${on.name} does not define openReplyChannel`);
      const subscription = await on.openReplyChannel(handler, options);
      subscriptions.push(subscription);
      return subscription;
    }

    /** Opens a reply channel whose handler records every reply and acks it. */
    async function collect(options?: ReplyChannelOptions) {
      const received: InboundMessage[] = [];
      const subscription = await open(async (message) => {
        received.push(message);
        return ACK;
      }, options);
      return { received, subscription };
    }

    /** Publishes a sentinel to `channel` and waits until `received` holds it. */
    async function sentinelThrough(channel: string, received: InboundMessage[]): Promise<void> {
      await responder.publish(channel, Buffer.from('sentinel'), { [SENTINEL]: true });
      await eventually(() => received.some((m) => m.headers[SENTINEL] === true), 'the sentinel');
    }

    /** Asserts what a publish to a closed reply channel does on this transport. */
    async function expectPublishToClosed(from: Transport, channel: string): Promise<void> {
      const published = from.publish(
        channel,
        Buffer.from('too late'),
        {},
        { timeoutMs: SETTLE_TIMEOUT_MS },
      );
      if (harness.publishToClosed === 'rejects') {
        await expect(published).rejects.toBeInstanceOf(PublishRejectedError);
      } else {
        await expect(published).resolves.toBeUndefined();
      }
    }

    it('delivers a reply published to its channel, body byte-exact and headers with their types', async () => {
      const { received, subscription } = await collect();
      const body = Buffer.concat([Buffer.from([0, 255, 128, 1, 0]), Buffer.from('réponse ✓')]);
      const headers: HeaderMap = { 'x-text': 'héllo', 'x-count': 42, 'x-yes': true, 'x-no': false };
      await responder.publish(subscription.channel, body, headers);

      await eventually(() => received.length === 1, 'the reply');
      const [reply] = received;
      expect(reply.channel).toBe(subscription.channel);
      expect(reply.body.equals(body)).toBe(true);
      expect(reply.redelivered).toBe(false);
      expect(reply.headers).toMatchObject(headers);
    });

    it('names each reply channel apart, with a name every broker takes', async () => {
      const names = new Set<string>();
      for (let index = 0; index < 3; index++) names.add((await collect()).subscription.channel);
      expect(names.size).toBe(3);
      for (const name of names) expect(name).toMatch(/^[A-Za-z0-9._-]{1,200}$/);
    });

    it('tells its reply channels from other channels (isReplyChannel)', async () => {
      const { subscription } = await collect();
      expect(transport.isReplyChannel?.(subscription.channel)).toBe(true);
      expect(responder.isReplyChannel?.(subscription.channel)).toBe(true);
      for (const other of ['orders', 'orders.dlq', 'nseq', 'reply']) {
        expect(transport.isReplyChannel?.(other)).toBe(false);
      }
    });

    it('keeps the replies of two channels apart', async () => {
      const first = await collect();
      const second = await collect();
      await responder.publish(first.subscription.channel, Buffer.from('to first'), {});
      await responder.publish(second.subscription.channel, Buffer.from('to second'), {});

      await eventually(
        () => first.received.length >= 1 && second.received.length >= 1,
        'both replies',
      );
      await sentinelThrough(first.subscription.channel, first.received);
      await sentinelThrough(second.subscription.channel, second.received);
      const bodies = (received: InboundMessage[]) =>
        received.filter((m) => m.headers[SENTINEL] !== true).map((m) => m.body.toString());
      expect(bodies(first.received)).toEqual(['to first']);
      expect(bodies(second.received)).toEqual(['to second']);
    });

    it('delivers every reply of a burst of 50 published at once (a reply sent as many fragments)', async () => {
      const { received, subscription } = await collect();
      const fragments = Array.from({ length: 50 }, () => randomBytes(32 * 1024));
      await Promise.all(
        fragments.map((body, index) =>
          responder.publish(subscription.channel, body, { 'x-position': index + 1 }),
        ),
      );

      await eventually(() => received.length >= fragments.length, 'all 50 replies');
      const byPosition = new Map(received.map((m) => [Number(m.headers['x-position']), m.body]));
      expect(byPosition.size).toBe(fragments.length);
      fragments.forEach((body, index) => {
        expect(byPosition.get(index + 1)?.equals(body)).toBe(true);
      });
    });

    it('takes a reply of maxMessageBytes, as any channel does, and refuses a larger one', async () => {
      const { received, subscription } = await collect();
      const headers: HeaderMap = { 'x-text': 'large reply' };
      const fits = responder.maxMessageBytes - headerBytes(headers);
      const body = randomBytes(fits);
      await responder.publish(subscription.channel, body, headers);
      await expect(
        responder.publish(subscription.channel, Buffer.alloc(fits + 1), headers),
      ).rejects.toBeInstanceOf(MessageTooLargeError);

      await eventually(() => received.length === 1, 'the large reply');
      expect(received[0].body.equals(body)).toBe(true);
    });

    it('removes an acknowledged reply: it is never delivered again', async () => {
      const { received, subscription } = await collect();
      await responder.publish(subscription.channel, Buffer.from('once'), {});
      await eventually(() => received.length === 1, 'the reply');

      await sentinelThrough(subscription.channel, received);
      expect(received.map((m) => m.body.toString())).toEqual(['once', 'sentinel']);
    });

    it('redelivers a requeued reply on the same channel, flagged redelivered', async () => {
      const deliveries: InboundMessage[] = [];
      const subscription = await open(async (message) => {
        deliveries.push(message);
        return deliveries.length === 1 ? { action: 'requeue' } : ACK;
      });
      await responder.publish(subscription.channel, Buffer.from('again'), { 'x-n': 1 });

      await eventually(() => deliveries.length === 2, 'the redelivery');
      expect(deliveries.map((m) => m.redelivered)).toEqual([false, true]);
      expect(deliveries.map((m) => m.channel)).toEqual([
        subscription.channel,
        subscription.channel,
      ]);
      expect(deliveries[1].body.toString()).toBe('again');
      expect(deliveries[1].headers['x-n']).toBe(1);
    });

    it('redelivers a reply requeued with delayMs on the same channel, counting in x-requeue-count', async () => {
      const body = randomBytes(64);
      const deliveries: InboundMessage[] = [];
      const subscription = await open(async (message) => {
        deliveries.push(message);
        return deliveries.length < 3 ? { action: 'requeue', delayMs: 20 } : ACK;
      });
      await responder.publish(subscription.channel, body, { 'x-text': 'kept' });

      await eventually(() => deliveries.length === 3, 'two delayed redeliveries');
      expect(deliveries.map((m) => m.redelivered)).toEqual([false, true, true]);
      expect(deliveries.map((m) => m.headers[REQUEUE_COUNT_HEADER])).toEqual([undefined, 1, 2]);
      for (const message of deliveries) {
        expect(message.channel).toBe(subscription.channel);
        expect(message.body.equals(body)).toBe(true);
        expect(message.headers).toMatchObject({ 'x-text': 'kept' });
      }
    });

    it('drops a dead-lettered reply: a reply channel has no dead-letter channel', async () => {
      const deliveries: InboundMessage[] = [];
      const subscription = await open(async (message) => {
        deliveries.push(message);
        return message.headers[SENTINEL] === true
          ? ACK
          : { action: 'dead-letter', reason: 'conformance: unreadable reply' };
      });
      await responder.publish(subscription.channel, Buffer.from('unreadable'), {});
      await eventually(() => deliveries.length === 1, 'the reply');

      await sentinelThrough(subscription.channel, deliveries);
      expect(deliveries.map((m) => m.body.toString())).toEqual(['unreadable', 'sentinel']);
    });

    it('never has more than prefetch unsettled replies in the handler', async () => {
      const prefetch = 2;
      const total = 6;
      const waiting: Array<() => void> = [];
      let holding = true;
      let done = 0;
      const subscription = await open(
        async () => {
          if (holding) await new Promise<void>((resolve) => waiting.push(resolve));
          done++;
          return ACK;
        },
        { prefetch },
      );
      for (let index = 0; index < total; index++) {
        await responder.publish(subscription.channel, Buffer.from(`m${index}`), {});
      }

      await eventually(() => waiting.length === prefetch, `${prefetch} held replies`);
      await sleep(200); // room for a wrong adapter to deliver more
      expect(waiting).toHaveLength(prefetch);

      holding = false;
      waiting.forEach((release) => release());
      await eventually(() => done === total, 'every reply');
    });

    it('refuses a prefetch RabbitMQ cannot take (0, or above 65535)', async () => {
      for (const prefetch of [0, MAX_PREFETCH + 1]) {
        await expect(open(async () => ACK, { prefetch })).rejects.toThrow(/prefetch/);
      }
    });

    it(`delivers nothing once closed; a publish to the closed channel ${harness.publishToClosed} within its timeout`, async () => {
      const closed = await collect();
      await closed.subscription.close();
      await expectPublishToClosed(responder, closed.subscription.channel);

      // Whatever the broker did with it, it does not reach the closed channel's handler.
      const other = await collect();
      await sentinelThrough(other.subscription.channel, other.received);
      expect(closed.received).toEqual([]);
    });

    (harness.sharedBroker ? it : it.skip)(
      `removes the reply channels of a closed transport: a publish to one ${harness.publishToClosed}`,
      async () => {
        const requester = await harness.create();
        let channel: string;
        try {
          channel = (await open(async () => ACK, {}, requester)).channel;
        } finally {
          await (harness.close ? harness.close(requester) : requester.close());
        }
        await expectPublishToClosed(responder, channel);
      },
    );

    it('refuses to open a reply channel once the transport is closed', async () => {
      const other = await harness.create();
      await (harness.close ? harness.close(other) : other.close());
      await expect(open(async () => ACK, {}, other)).rejects.toThrow(/closed/);
    });
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
