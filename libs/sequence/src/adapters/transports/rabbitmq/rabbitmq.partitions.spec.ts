import { randomUUID } from 'node:crypto';
import { Logger } from '@nestjs/common';
import type * as amqplib from 'amqplib';
import { eventually } from '../../../testing/conformance/transport.conformance';
import { rabbitmqctl } from '../../../../test/support/processes/rabbitmqctl';
import { amqpConnection, AMQP_URL, silentLogger } from '../../../../test/support/rabbitmq.fixture';
import { describeWithServer } from '../../../../test/support/servers';
import { PartitionCountMismatchError } from '../../../core/errors/partition-count-mismatch.error';
import type { Disposition, InboundMessage, Subscription } from '../../../ports/transport.port';
import type { RabbitMqQueueType } from './rabbitmq.options';
import { RabbitMqTransport } from './rabbitmq.transport';

const ACK: Disposition = { action: 'ack' };

describeWithServer('rabbitmq', 'RabbitMqTransport partitioned channels', () => {
  const queues = new Set<string>();
  const exchanges = new Set<string>();
  const transports: RabbitMqTransport[] = [];
  let admin: amqplib.ChannelModel;

  beforeAll(async () => {
    admin = await amqpConnection();
  });

  afterAll(async () => {
    await admin.close();
  });

  afterEach(async () => {
    for (const transport of transports.splice(0)) await transport.close();
    const channel = await admin.createChannel();
    for (const queue of queues) await channel.deleteQueue(queue);
    for (const exchange of exchanges) await channel.deleteExchange(exchange);
    queues.clear();
    exchanges.clear();
    await channel.close();
  });

  /** A channel of the test's own; its queues and marker are deleted after the test. */
  function newChannel(count: number): string {
    const channel = `rmqp.${randomUUID()}`;
    queues.add(channel).add(`${channel}.dlq`);
    for (let index = 0; index < count; index++) queues.add(`${channel}.partition.${index}`);
    exchanges.add(`${channel}.partitions`);
    return channel;
  }

  /** A transport on a connection of its own, as another process would have. */
  async function connect(queueType: RabbitMqQueueType = 'classic'): Promise<RabbitMqTransport> {
    const transport = await RabbitMqTransport.connect(
      AMQP_URL,
      { queueType },
      {
        logger: silentLogger,
        connectionManagerOptions: { reconnectTimeInSeconds: 0.2 },
      },
    );
    transports.push(transport);
    return transport;
  }

  const to = (index: number, count: number) => ({ partition: { index, count } });

  /** Polls an asynchronous `check` until it holds; fails naming `what` after 10 s. */
  async function until(check: () => Promise<boolean>, what: string): Promise<void> {
    const deadline = Date.now() + 10_000;
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }

  /** Consumers and ready messages of `queue`, as the broker counts them. */
  async function queueState(queue: string): Promise<amqplib.Replies.AssertQueue> {
    const raw = await admin.createChannel();
    try {
      return await raw.checkQueue(queue);
    } finally {
      await raw.close();
    }
  }

  /**
   * Has the broker close a subscription's channel, leaving the connection up, as it does when a
   * delivery outlives `consumer_timeout` (406 PRECONDITION_FAILED): acking a delivery tag it never
   * issued is the same channel error. Reaches into the subscription for its amqplib channel.
   */
  async function breakChannelOf(subscription: Subscription): Promise<void> {
    const [{ amqp: channel }] = (
      subscription as unknown as { consumers: Array<{ amqp: amqplib.Channel }> }
    ).consumers;
    const closed = new Promise((resolve) => channel.once('close', resolve));
    channel.ack({ fields: { deliveryTag: 999_999 } } as amqplib.Message);
    await closed;
  }

  /** Subscribes a handler that holds each first delivery unsettled and acks redeliveries. */
  async function holdFirstDeliveries(transport: RabbitMqTransport, channel: string, count: number) {
    const received: InboundMessage[] = [];
    const verdicts: Array<(disposition: Disposition) => void> = [];
    const subscription = await transport.subscribe(
      channel,
      (message) => {
        received.push(message);
        if (message.redelivered) return Promise.resolve(ACK);
        return new Promise<Disposition>((resolve) => verdicts.push(resolve));
      },
      { partitions: count },
    );
    return { received, verdicts, subscription };
  }

  it.each<RabbitMqQueueType>(['classic', 'quorum'])(
    'declares %s partition queues <channel>.partition.<i> with single active consumer, dead-lettering into <channel>.dlq, and the count on the marker <channel>.partitions',
    async (queueType) => {
      const transport = await connect(queueType);
      const channel = newChannel(3);
      await transport.publish(channel, Buffer.from('x'), {}, to(1, 3));

      const listed = JSON.parse(
        await rabbitmqctl([
          'list_queues',
          'name',
          'type',
          'durable',
          'arguments',
          '--formatter',
          'json',
          '-q',
        ]),
      ) as Array<{ name: string; type: string; durable: boolean; arguments: unknown[] }>;
      const declared = listed
        .filter((queue) => queue.name.startsWith(`${channel}.`) || queue.name === channel)
        .sort((a, b) => a.name.localeCompare(b.name));
      // No plain queue: its producers and consumers declare it.
      expect(declared.map(({ name, type, durable }) => ({ name, type, durable }))).toEqual([
        { name: `${channel}.dlq`, type: queueType, durable: true },
        ...[0, 1, 2].map((index) => ({
          name: `${channel}.partition.${index}`,
          type: queueType,
          durable: true,
        })),
      ]);
      for (const queue of declared.slice(1)) {
        expect(queue.arguments).toEqual(
          expect.arrayContaining([
            ['x-single-active-consumer', 'bool', true],
            ['x-dead-letter-exchange', 'longstr', ''],
            ['x-dead-letter-routing-key', 'longstr', `${channel}.dlq`],
          ]),
        );
      }

      const markers = JSON.parse(
        await rabbitmqctl([
          'list_exchanges',
          'name',
          'type',
          'durable',
          'arguments',
          '--formatter',
          'json',
          '-q',
        ]),
      ) as Array<{ name: string; type: string; durable: boolean; arguments: unknown[] }>;
      const marker = markers.find((exchange) => exchange.name === `${channel}.partitions`);
      expect(marker).toMatchObject({
        type: 'fanout',
        durable: true,
        arguments: [['alternate-exchange', 'longstr', 'nseq.partitions.3']],
      });
    },
  );

  it('tells the count the channel was declared with, to another process and to its own', async () => {
    const producer = await connect();
    const consumer = await connect();
    const channel = newChannel(4);
    await producer.publish(channel, Buffer.from('x'), {}, to(3, 4));

    const refused = { channel, requested: 2, declared: 4 };
    const subscribed = consumer.subscribe(channel, async () => ACK, { partitions: 2 });
    await expect(subscribed).rejects.toBeInstanceOf(PartitionCountMismatchError);
    await expect(subscribed).rejects.toMatchObject(refused);
    await expect(producer.publish(channel, Buffer.from('y'), {}, to(0, 2))).rejects.toMatchObject(
      refused,
    );
    await expect(producer.publish(channel, Buffer.from('y'), {}, to(0, 2))).rejects.toThrow(
      /partitioned 4 ways, not 2/,
    );
    // Both still work with the declared count.
    const received: InboundMessage[] = [];
    await consumer.subscribe(
      channel,
      async (message) => {
        received.push(message);
        return ACK;
      },
      { partitions: 4 },
    );
    await eventually(() => received.length === 1, 'the message');
    expect([received[0].partition, received[0].body.toString()]).toEqual([3, 'x']);
  });

  it('still refuses another count when the channel name is too long for the broker to tell the declared one', async () => {
    const producer = await connect();
    const consumer = await connect();
    // The broker cuts its reply text at 255 bytes: past it, the declared count is not in it.
    const channel = newChannel(2).padEnd(200, 'x');
    queues.add(`${channel}.dlq`).add(`${channel}.partition.0`).add(`${channel}.partition.1`);
    exchanges.add(`${channel}.partitions`);
    await producer.publish(channel, Buffer.from('x'), {}, to(0, 2));

    const subscribed = consumer.subscribe(channel, async () => ACK, { partitions: 3 });
    await expect(subscribed).rejects.toBeInstanceOf(PartitionCountMismatchError);
    await expect(subscribed).rejects.toMatchObject({ channel, requested: 3, declared: undefined });
    await expect(subscribed).rejects.toThrow(/partitioned with another count, not 3/);
  });

  it('consumes every partition again on a new channel after the broker closes its channel (as on consumer_timeout), redelivering what was held', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const transport = await connect();
    const channel = newChannel(2);
    const { received, verdicts, subscription } = await holdFirstDeliveries(transport, channel, 2);
    await transport.publish(channel, Buffer.from('a'), {}, to(0, 2));
    await transport.publish(channel, Buffer.from('b'), {}, to(1, 2));
    await eventually(() => verdicts.length === 2, 'two held messages');

    await breakChannelOf(subscription);
    await eventually(() => received.length === 4, 'the redeliveries');
    const seen = received.map((m) => [m.partition, m.body.toString(), m.redelivered]);
    expect(seen.slice(2).sort()).toEqual([
      [0, 'a', true],
      [1, 'b', true],
    ]);
    expect(warn).toHaveBeenCalledWith(expect.stringMatching(/closed the channel.*opens in/));

    // The held deliveries' late verdicts change nothing; both partitions are consumed again.
    for (const verdict of verdicts) verdict(ACK);
    await transport.publish(channel, Buffer.from('c'), {}, to(0, 2));
    await transport.publish(channel, Buffer.from('d'), {}, to(1, 2));
    await eventually(() => received.length === 6, 'the messages published after');
    expect(received.slice(4).map((m) => [m.partition, m.body.toString()])).toEqual([
      [0, 'c'],
      [1, 'd'],
    ]);
    for (const queue of [`${channel}.partition.0`, `${channel}.partition.1`]) {
      expect(await queueState(queue)).toMatchObject({ messageCount: 0, consumerCount: 1 });
    }
    warn.mockRestore();
  });

  it("moves a partition to another process's subscriber when the broker closes the active one's channel", async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const first = await connect();
    const second = await connect();
    const channel = newChannel(2);
    const holder = await holdFirstDeliveries(first, channel, 2);
    const standby: InboundMessage[] = [];
    await second.subscribe(
      channel,
      async (message) => {
        standby.push(message);
        return ACK;
      },
      { partitions: 2 },
    );
    await first.publish(channel, Buffer.from('held'), {}, to(1, 2));
    await eventually(() => holder.verdicts.length === 1, 'the held message');

    await breakChannelOf(holder.subscription);
    await eventually(() => standby.length === 1, 'the redelivery to the other process');
    expect([standby[0].partition, standby[0].body.toString(), standby[0].redelivered]).toEqual([
      1,
      'held',
      true,
    ]);
    // The other process stays the active one once the first consumes again (in line behind it).
    await until(
      async () => (await queueState(`${channel}.partition.1`)).consumerCount === 2,
      'the first process consuming again',
    );
    await first.publish(channel, Buffer.from('after'), {}, to(1, 2));
    await eventually(() => standby.length === 2, 'the next message');
    expect(standby[1].body.toString()).toBe('after');
    expect(holder.received.map((m) => m.body.toString())).toEqual(['held']);
    warn.mockRestore();
  });

  it('hands a partition over on close with what it held first, before what is published meanwhile', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const count = 8;
    const [first, second, producer] = [await connect(), await connect(), await connect()];
    const channel = newChannel(count);
    const held: InboundMessage[] = [];
    const active = await first.subscribe(
      channel,
      (message) => {
        held.push(message);
        return new Promise<Disposition>(() => undefined); // unsettled until the close
      },
      { partitions: count },
    );
    const taken: string[] = [];
    await second.subscribe(
      channel,
      async (message) => {
        taken.push(message.body.toString());
        return ACK;
      },
      { partitions: count },
    );
    await producer.publish(channel, Buffer.from('m1'), {}, to(0, count));
    await eventually(() => held.length === 1, 'm1 held by the active subscriber');

    // A producer goes on publishing to the partition while the active subscriber closes.
    const closing = active.close();
    const later = producer.publish(channel, Buffer.from('m2'), {}, to(0, count));
    await Promise.all([closing, later]);
    await eventually(() => taken.length === 2, 'both messages at the next subscriber');
    expect(taken).toEqual(['m1', 'm2']);
    warn.mockRestore();
  });

  it('keeps the dead letters of partitions in the channel’s dead-letter queue, browsable under the channel and replayed to its plain queue', async () => {
    const transport = await connect();
    const channel = newChannel(2);
    // One rejected by a plain client: the broker's own dead-lettering.
    await transport.publish(channel, Buffer.from('rejected'), { 'x-n': 2 }, to(0, 2));
    const raw = await admin.createChannel();
    const rejected = await raw.get(`${channel}.partition.0`);
    expect(rejected).not.toBe(false);
    raw.nack(rejected as amqplib.GetMessage, false, false);
    // One dead-lettered by its subscriber.
    const subscription = await transport.subscribe(
      channel,
      async () => ({ action: 'dead-letter', reason: 'test: poison' }),
      { partitions: 2 },
    );
    await transport.publish(channel, Buffer.from('poison'), { 'x-n': 1 }, to(1, 2));
    await until(
      async () => (await queueState(`${channel}.dlq`)).messageCount === 2,
      'two dead letters',
    );
    await subscription.close();

    const box = transport.deadLetters();
    const page = await box.browse(channel, { limit: 10 });
    expect(
      page.items.map((letter) => [letter.channel, letter.headers['x-n'], letter.reason]).sort(),
    ).toEqual([
      [channel, 1, 'test: poison'],
      [channel, 2, expect.stringContaining(`${channel}.partition.0`)],
    ]);
    const replayed = await box.replay(
      channel,
      page.items.map((letter) => letter.id),
      { ratePerSecond: 100 },
    );
    expect(replayed.done).toHaveLength(2);
    const plain: string[] = [];
    for (;;) {
      const message = await raw.get(channel, { noAck: true });
      if (!message) break;
      plain.push(message.content.toString());
    }
    expect(plain.sort()).toEqual(['poison', 'rejected']);
    await raw.close();
  });
});
