import { randomUUID } from 'node:crypto';
import { PartitionCountMismatchError } from '../../core/errors/partition-count-mismatch.error';
import type { HeaderMap } from '../../core/headers';
import {
  REQUEUE_COUNT_HEADER,
  type Disposition,
  type InboundMessage,
  type MessageHandler,
  type SubscribeOptions,
  type Subscription,
  type Transport,
} from '../../ports/transport.port';
import { eventually } from './transport.conformance';

export interface PartitionedChannelHarness {
  /** A connected transport. */
  create(): Promise<Transport>;
  /** Closes it and cleans up (the channels' partitions included); `transport.close()` when absent. */
  close?(transport: Transport): Promise<void>;
  /**
   * True when two transports of `create()` reach one broker, as two processes would: the cases
   * about several subscribers, and about producers and consumers that disagree on a partition
   * count, then use a second transport for the other party. @default false
   */
  readonly sharedBroker?: boolean;
}

const ACK: Disposition = { action: 'ack' };
const SENTINEL = 'x-conformance-sentinel';
/** Header the suite sets on each message: the partition it published it to. */
const SENT_TO = 'x-conformance-partition';

/**
 * The behaviour of a {@link Transport} with partitioned channels (`partitioned: true`; see the
 * port's contract). Each case uses channels of its own (`conf.<uuid>`), so the suite can run
 * against a shared broker.
 *
 * On a transport without `partitioned` the partitioned behaviour is not run: every case checks
 * instead that the transport refuses `partition` and `partitions` with a RangeError, as the port
 * says, so the suite can be called for any transport.
 */
export function describePartitionedChannelConformance(
  adapterName: string,
  harness: PartitionedChannelHarness,
): void {
  describe(`Partitioned channel conformance: ${adapterName}`, () => {
    let transport: Transport;
    /** Another process's view of the broker: a second transport when it is shared. */
    let other: Transport;
    let subscriptions: Subscription[];

    beforeEach(async () => {
      transport = await harness.create();
      other = harness.sharedBroker ? await harness.create() : transport;
      subscriptions = [];
    });

    afterEach(async () => {
      await Promise.all(
        subscriptions.map((subscription) => subscription.close().catch(() => undefined)),
      );
      const close = (t: Transport) => (harness.close ? harness.close(t) : t.close());
      if (other !== transport) await close(other);
      await close(transport);
    });

    const newChannel = (): string => `conf.${randomUUID()}`;

    /** A case of the partitioned behaviour; on a transport without it, the refusal instead. */
    function partitionedCase(name: string, body: () => Promise<void>, timeoutMs?: number): void {
      it(
        name,
        async () => {
          if (transport.partitioned) await body();
          else await expectPartitionsRefused();
        },
        timeoutMs,
      );
    }

    async function expectPartitionsRefused(): Promise<void> {
      const channel = newChannel();
      await expect(
        transport.publish(channel, Buffer.from('m'), {}, { partition: { index: 0, count: 2 } }),
      ).rejects.toBeInstanceOf(RangeError);
      await expect(
        transport.subscribe(channel, async () => ACK, { partitions: 2 }),
      ).rejects.toBeInstanceOf(RangeError);
    }

    async function subscribe(
      on: Transport,
      channel: string,
      handler: MessageHandler,
      options?: SubscribeOptions,
    ): Promise<Subscription> {
      const subscription = await on.subscribe(channel, handler, options);
      subscriptions.push(subscription);
      return subscription;
    }

    /** Subscribes a handler that records every message and acks it. */
    async function collect(channel: string, options?: SubscribeOptions, on = transport) {
      const received: InboundMessage[] = [];
      const subscription = await subscribe(
        on,
        channel,
        async (message) => {
          received.push(message);
          return ACK;
        },
        options,
      );
      return { received, subscription };
    }

    /** Subscribes a handler that records every message and never settles it. */
    async function hold(channel: string, options?: SubscribeOptions, on = transport) {
      const received: InboundMessage[] = [];
      const verdicts: Array<(disposition: Disposition) => void> = [];
      const subscription = await subscribe(
        on,
        channel,
        (message) => {
          received.push(message);
          return new Promise<Disposition>((resolve) => verdicts.push(resolve));
        },
        options,
      );
      return { received, verdicts, subscription };
    }

    function publishTo(
      channel: string,
      index: number,
      count: number,
      text: string,
      headers: HeaderMap = {},
      on = transport,
    ): Promise<void> {
      return on.publish(
        channel,
        Buffer.from(text),
        { ...headers, [SENT_TO]: index },
        { partition: { index, count } },
      );
    }

    /** Publishes a sentinel to each partition and waits until `received` holds all of them. */
    async function sentinelsThrough(
      channel: string,
      count: number,
      received: InboundMessage[],
    ): Promise<void> {
      for (let index = 0; index < count; index++) {
        await publishTo(channel, index, count, `sentinel ${index}`, { [SENTINEL]: true });
      }
      await eventually(
        () => received.filter((m) => m.headers[SENTINEL] === true).length === count,
        `the sentinel of each of ${count} partitions`,
      );
    }

    /** What a fresh subscriber to every partition finds in them, before a sentinel of each. */
    async function leftoversInPartitions(
      channel: string,
      count: number,
    ): Promise<InboundMessage[]> {
      const { received } = await collect(channel, { partitions: count });
      await sentinelsThrough(channel, count, received);
      return received.filter((m) => m.headers[SENTINEL] !== true);
    }

    const describeMessage = (m: InboundMessage) => [m.partition, m.body.toString(), m.redelivered];

    partitionedCase(
      'delivers partition messages to partitioned subscribers only, each from its own partition',
      async () => {
        const channel = newChannel();
        const count = 4;
        const partitioned = await collect(channel, { partitions: count });
        const plain = await collect(channel);
        const elsewhere = await collect(newChannel(), { partitions: count });

        for (let index = 0; index < count; index++) {
          await publishTo(channel, index, count, `p${index}`);
        }
        await transport.publish(channel, Buffer.from('plain'), {});

        await eventually(() => partitioned.received.length === count, 'a message per partition');
        await eventually(() => plain.received.length === 1, 'the plain message');
        for (const message of partitioned.received) {
          expect(message.channel).toBe(channel);
          expect(message.redelivered).toBe(false);
          expect(message.partition).toBe(message.headers[SENT_TO]);
          expect(message.body.toString()).toBe(`p${String(message.partition)}`);
        }
        expect(partitioned.received.map((m) => m.partition).sort()).toEqual([0, 1, 2, 3]);
        expect(plain.received[0].body.toString()).toBe('plain');
        expect(plain.received[0].partition).toBeUndefined();

        // Nothing more went to either side, nor to another channel's partitions.
        await sentinelsThrough(channel, count, partitioned.received);
        await transport.publish(channel, Buffer.from('plain sentinel'), { [SENTINEL]: true });
        await eventually(() => plain.received.length === 2, 'the plain sentinel');
        expect(partitioned.received.length).toBe(2 * count);
        expect(plain.received[1].body.toString()).toBe('plain sentinel');
        expect(elsewhere.received).toEqual([]);
      },
    );

    partitionedCase(
      'delivers the messages of a partition in the order they were published',
      async () => {
        const channel = newChannel();
        const count = 3;
        const perPartition = 20;
        // Half before anyone subscribed, half after; the partitions interleaved.
        for (let n = 0; n < perPartition / 2; n++) {
          for (let index = 0; index < count; index++) {
            await publishTo(channel, index, count, `${n}`);
          }
        }
        const { received } = await collect(channel, { partitions: count });
        for (let n = perPartition / 2; n < perPartition; n++) {
          for (let index = 0; index < count; index++) {
            await publishTo(channel, index, count, `${n}`);
          }
        }

        await eventually(() => received.length === count * perPartition, 'every message');
        for (let index = 0; index < count; index++) {
          const order = received.filter((m) => m.partition === index).map((m) => m.body.toString());
          expect({ index, order }).toEqual({
            index,
            order: Array.from({ length: perPartition }, (_, n) => `${n}`),
          });
        }
      },
    );

    partitionedCase(
      'gives all of a partition to one subscriber when two subscribe to every partition',
      async () => {
        const channel = newChannel();
        const count = 4;
        const perPartition = 8;
        const slowCollector = () => {
          const received: InboundMessage[] = [];
          const handler: MessageHandler = async (message) => {
            await sleep(2);
            received.push(message);
            return ACK;
          };
          return { received, handler };
        };
        const a = slowCollector();
        const b = slowCollector();
        await subscribe(transport, channel, a.handler, { partitions: count, prefetch: 1 });
        await subscribe(other, channel, b.handler, { partitions: count, prefetch: 1 });
        for (let n = 0; n < perPartition; n++) {
          for (let index = 0; index < count; index++) {
            await publishTo(channel, index, count, `${index}.${n}`);
          }
        }

        await eventually(
          () => a.received.length + b.received.length === count * perPartition,
          'every message',
        );
        for (let index = 0; index < count; index++) {
          const inA = a.received.filter((m) => m.partition === index).length;
          const inB = b.received.filter((m) => m.partition === index).length;
          expect({ index, inA, inB }).toEqual(
            inA > 0 ? { index, inA: perPartition, inB: 0 } : { index, inA: 0, inB: perPartition },
          );
        }
        expect(a.received.map((m) => m.redelivered)).not.toContain(true);
        expect(b.received.map((m) => m.redelivered)).not.toContain(true);
      },
    );

    partitionedCase(
      "hands a closed subscriber's unsettled messages to the other, redelivered, in order",
      async () => {
        const channel = newChannel();
        const count = 2;
        const first = await hold(channel, { partitions: count });
        const second = await collect(channel, { partitions: count }, other);
        for (const text of ['a', 'b', 'c']) await publishTo(channel, 0, count, text);
        await publishTo(channel, 1, count, 'd');
        await eventually(() => first.received.length === 4, 'four held messages');
        // In order within each partition; the partitions are pulled apart, in no order between them.
        const heldIn = (index: number) =>
          first.received.filter((m) => m.partition === index).map(describeMessage);
        expect(heldIn(0)).toEqual([
          [0, 'a', false],
          [0, 'b', false],
          [0, 'c', false],
        ]);
        expect(heldIn(1)).toEqual([[1, 'd', false]]);

        // Held, they are not redelivered while their holder lives: the sentinels published after
        // them reach the holder, and nothing reached the other subscriber.
        await sentinelsThrough(channel, count, first.received);
        expect(first.received.length).toBe(4 + count);
        expect(second.received).toEqual([]);

        await first.subscription.close();
        await eventually(() => second.received.length === 4 + count, 'the redeliveries');
        for (const message of second.received) expect(message.redelivered).toBe(true);
        const bodiesOf = (index: number) =>
          second.received.filter((m) => m.partition === index).map((m) => m.body.toString());
        expect(bodiesOf(0)).toEqual(['a', 'b', 'c', 'sentinel 0']);
        expect(bodiesOf(1)).toEqual(['d', 'sentinel 1']);

        // The closed subscriber's late verdicts change nothing, and the partitions still work.
        for (const verdict of first.verdicts) verdict({ action: 'requeue' });
        await publishTo(channel, 1, count, 'after');
        await eventually(() => second.received.length === 5 + count, 'the next message');
        expect(describeMessage(second.received.at(-1)!)).toEqual([1, 'after', false]);
        await second.subscription.close();
        expect(await leftoversInPartitions(channel, count)).toEqual([]);
      },
    );

    partitionedCase(
      'puts a message requeued with delayMs at the tail of its own partition',
      async () => {
        const channel = newChannel();
        const count = 2;
        const plain = await collect(channel);
        const received: InboundMessage[] = [];
        await subscribe(
          transport,
          channel,
          async (message) => {
            received.push(message);
            const first = message.body.toString() === 'first' && !message.redelivered;
            return first ? { action: 'requeue', delayMs: 20 } : ACK;
          },
          { partitions: count, prefetch: 1 },
        );
        await publishTo(channel, 1, count, 'first', { 'x-kept': 'yes' });
        await publishTo(channel, 1, count, 'second');

        await eventually(() => received.length === 3, 'the delayed redelivery');
        expect(received.map(describeMessage)).toEqual([
          [1, 'first', false],
          [1, 'second', false],
          [1, 'first', true],
        ]);
        expect(received[2].headers).toMatchObject({ 'x-kept': 'yes', [REQUEUE_COUNT_HEADER]: 1 });
        expect(received[2].channel).toBe(channel);
        await transport.publish(channel, Buffer.from('plain sentinel'), { [SENTINEL]: true });
        await eventually(() => plain.received.length === 1, 'the plain sentinel');
        expect(plain.received[0].body.toString()).toBe('plain sentinel');
      },
    );

    partitionedCase(
      "dead-letters to the channel's dead-letter channel, with x-death-reason",
      async () => {
        const channel = newChannel();
        const count = 3;
        const dead = await collect(transport.deadLetterChannel(channel));
        const reason = 'crc-mismatch: fragment 2 of sequence s-9';
        const original = await subscribe(
          transport,
          channel,
          async (message) =>
            message.headers['x-poison'] === true ? { action: 'dead-letter', reason } : ACK,
          { partitions: count },
        );
        await publishTo(channel, 2, count, 'poison', { 'x-poison': true, 'x-n': 3 });

        await eventually(() => dead.received.length === 1, 'the dead letter');
        expect(dead.received[0].body.toString()).toBe('poison');
        expect(dead.received[0].headers).toMatchObject({
          'x-poison': true,
          'x-n': 3,
          'x-death-reason': reason,
        });
        await original.close();
        expect(await leftoversInPartitions(channel, count)).toEqual([]);
      },
    );

    partitionedCase('never has more than prefetch unsettled messages per partition', async () => {
      const channel = newChannel();
      const count = 3;
      const prefetch = 2;
      const perPartition = 5;
      for (let n = 0; n < perPartition; n++) {
        for (let index = 0; index < count; index++) {
          await publishTo(channel, index, count, `${index}.${n}`);
        }
      }
      const { received, verdicts } = await hold(channel, { partitions: count, prefetch });

      await eventually(() => received.length === count * prefetch, `${prefetch} per partition`);
      await sleep(200); // room for a wrong adapter to deliver more
      expect(received.length).toBe(count * prefetch);
      for (let index = 0; index < count; index++) {
        const held = received.filter((m) => m.partition === index).map((m) => m.body.toString());
        expect(held).toEqual([`${index}.0`, `${index}.1`]);
      }

      // Settling one partition's messages frees that partition's slots only.
      const settled = new Set<InboundMessage>();
      const settle = (message: InboundMessage) => {
        settled.add(message);
        verdicts[received.indexOf(message)](ACK);
      };
      received.filter((m) => m.partition === 0).forEach(settle);
      await eventually(() => received.length === count * prefetch + 2, 'two more of partition 0');
      expect(received.slice(count * prefetch).map((m) => m.body.toString())).toEqual([
        '0.2',
        '0.3',
      ]);

      // Settling the rest as they come, everything arrives, never over prefetch per partition.
      let mostUnsettled = 0;
      await eventually(() => {
        for (let index = 0; index < count; index++) {
          const unsettled = received.filter((m) => m.partition === index && !settled.has(m));
          mostUnsettled = Math.max(mostUnsettled, unsettled.length);
        }
        for (const message of [...received]) if (!settled.has(message)) settle(message);
        return received.length === count * perPartition;
      }, 'every message');
      expect(mostUnsettled).toBeLessThanOrEqual(prefetch);
      expect(received.length).toBe(count * perPartition);
    });

    describe('refuses a partition count other than the one the channel was declared with', () => {
      for (const [first, declared, asked] of [
        ['producer', 4, 2],
        ['producer', 2, 4],
        ['consumer', 4, 2],
        ['consumer', 2, 4],
      ] as const) {
        partitionedCase(
          `${first} first with ${declared}, then ${asked}: publish and subscribe reject with PartitionCountMismatchError`,
          async () => {
            const channel = newChannel();
            let consumer: { received: InboundMessage[] } | undefined;
            if (first === 'producer') await publishTo(channel, 0, declared, 'declares');
            else consumer = await collect(channel, { partitions: declared });

            // Another process, with another count.
            const mismatch = expect.objectContaining({ channel, requested: asked });
            const subscribed = other.subscribe(channel, async () => ACK, { partitions: asked });
            await expect(subscribed).rejects.toBeInstanceOf(PartitionCountMismatchError);
            await expect(subscribed).rejects.toEqual(mismatch);
            const published = publishTo(channel, asked - 1, asked, 'refused', {}, other);
            await expect(published).rejects.toBeInstanceOf(PartitionCountMismatchError);
            await expect(published).rejects.toEqual(mismatch);
            const declaredCount = (
              (await published.catch((e: unknown) => e)) as { declared?: number }
            ).declared;
            expect([undefined, declared]).toContain(declaredCount);

            // The declared count still works, and nothing was sent with the other.
            consumer ??= await collect(channel, { partitions: declared }, other);
            const { received } = consumer;
            await sentinelsThrough(channel, declared, received);
            const kept = received.filter((m) => m.headers[SENTINEL] !== true);
            expect(kept.map((m) => m.body.toString())).toEqual(
              first === 'producer' ? ['declares'] : [],
            );
          },
        );
      }
    });

    partitionedCase(
      'refuses a partition address or count out of range with a RangeError, sending nothing',
      async () => {
        const channel = newChannel();
        const count = 2;
        for (const partition of [
          { index: 2, count },
          { index: -1, count },
          { index: 0.5, count },
          { index: 0, count: 0 },
          { index: 0, count: 257 },
        ]) {
          await expect(
            transport.publish(channel, Buffer.from('m'), {}, { partition }),
          ).rejects.toBeInstanceOf(RangeError);
        }
        for (const partitions of [0, 1.5, 257]) {
          await expect(
            transport.subscribe(channel, async () => ACK, { partitions }),
          ).rejects.toBeInstanceOf(RangeError);
        }
        expect(await leftoversInPartitions(channel, count)).toEqual([]);
      },
    );
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
