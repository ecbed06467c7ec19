import { randomUUID } from 'node:crypto';
import type { Socket } from 'node:net';
import { Logger, type LoggerService } from '@nestjs/common';
import { AmqpConnection, type RabbitMQConfig } from '@golevelup/nestjs-rabbitmq';
import * as amqplib from 'amqplib';
import {
  eventually,
  describeTransportConformance,
} from '../../../testing/conformance/transport.conformance';
import { describeReplyChannelConformance } from '../../../testing/conformance/reply-channel.conformance';
import { describePartitionedChannelConformance } from '../../../testing/conformance/partitioned-channel.conformance';
import { refuseEveryPublish } from '../../../../test/faults/support/broker-policy';
import { closeConnectionsWhere, rabbitmqctl } from '../../../../test/support/processes/rabbitmqctl';
import { describeWithServer, SERVERS } from '../../../../test/support/servers';
import { amqpConnection } from '../../../../test/support/rabbitmq.fixture';
import { FreezingProxy } from '../../../../test/support/freezing-proxy';
import { InvalidHeaderError } from '../../../core/errors/invalid-header.error';
import { FAILED_FORWARD_PAUSE_MS } from './rabbitmq.subscription';
import { MessageTooLargeError } from '../../../core/errors/message-too-large.error';
import { PublishRejectedError } from '../../../core/errors/publish-rejected.error';
import { PublishTimeoutError } from '../../../core/errors/publish-timeout.error';
import { SubscribeError } from '../../../core/errors/subscribe.error';
import type { HeaderMap } from '../../../core/headers';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import type {
  Disposition,
  InboundMessage,
  Subscription,
  Transport,
} from '../../../ports/transport.port';
import { contentAssembledInPlace } from './amqp-content-reads';
import { framesCoalesced } from './amqp-frame-writes';
import { RabbitMqTopologyError } from './errors/rabbitmq-topology.error';
import type { RabbitMqQueueType } from './rabbitmq.options';
import { RabbitMqTransport } from './rabbitmq.transport';

const URL = SERVERS.rabbitmq.url;
const ACK: Disposition = { action: 'ack' };

const silent: LoggerService = {
  log: () => undefined,
  error: () => undefined,
  warn: () => undefined,
};
/** golevelup settings for tests: quiet, and quick to reconnect after a drop. */
const connectionConfig = (reconnectSeconds = 0.2): Omit<RabbitMQConfig, 'uri'> => ({
  logger: silent,
  enableDirectReplyTo: false,
  registerHandlers: false,
  connectionManagerOptions: { reconnectTimeInSeconds: reconnectSeconds },
});

describeWithServer('rabbitmq', 'RabbitMqTransport', () => {
  /** Every queue a test may have created; deleted after each test. */
  const queues = new Set<string>();
  /** Every exchange likewise (partition count markers). */
  const exchanges = new Set<string>();
  let admin: amqplib.ChannelModel;

  beforeAll(async () => {
    admin = await amqpConnection();
  });

  afterAll(async () => {
    await deleteQueues();
    await admin.close();
  });

  async function deleteQueues(): Promise<void> {
    const channel = await admin.createChannel();
    for (const queue of queues) await channel.deleteQueue(queue);
    queues.clear();
    for (const exchange of exchanges) await channel.deleteExchange(exchange);
    exchanges.clear();
    await channel.close();
  }

  /**
   * Whether the broker holds `queue`, asked with a passive declare on a channel of its own: 404
   * when it does not, 405 when it is exclusive to another connection (so it exists). Milliseconds,
   * where `rabbitmqctl list_queues` takes a second or two to start its Erlang node.
   */
  async function queueExists(queue: string): Promise<boolean> {
    const channel = await admin.createChannel();
    channel.on('error', () => undefined);
    try {
      await channel.checkQueue(queue);
      await channel.close();
      return true;
    } catch (error) {
      const { code } = error as { code?: number };
      if (code === 404) return false;
      if (code === 405) return true;
      throw error;
    }
  }

  /** A channel name of the test's own, with its dead-letter queues registered for cleanup. */
  function newChannel(): string {
    const channel = `rmq.${randomUUID()}`;
    for (const queue of [channel, `${channel}.dlq`, `${channel}.dlq.dlq`]) queues.add(queue);
    return channel;
  }

  /** Records every channel the suite touches, so that its queues can be deleted. */
  function tracked(transport: Transport): Transport {
    const track = (channel: string, partitions?: number) => {
      queues.add(channel).add(transport.deadLetterChannel(channel));
      if (partitions === undefined) return;
      exchanges.add(`${channel}.partitions`);
      for (let index = 0; index < partitions; index++) queues.add(`${channel}.partition.${index}`);
    };
    return {
      name: transport.name,
      maxMessageBytes: transport.maxMessageBytes,
      partitioned: transport.partitioned,
      deadLetterChannel: (channel) => transport.deadLetterChannel(channel),
      ping: () => transport.ping(),
      publish: (channel, body, headers, options) => {
        track(channel, options?.partition?.count);
        return transport.publish(channel, body, headers, options);
      },
      subscribe: (channel, handler, options) => {
        track(channel, options?.partitions);
        if (options?.deadLetterChannel) track(options.deadLetterChannel);
        return transport.subscribe(channel, handler, options);
      },
      close: () => transport.close(),
    };
  }

  // The quorum run also names dead-letter queues its own way: the suite must follow the transport.
  for (const [queueType, deadLetterSuffix, unsafeSocketTricks] of [
    ['classic', undefined, false],
    ['quorum', '.dead', false],
    ['classic', undefined, true],
  ] as const) {
    const name =
      `rabbitmq (${queueType} queues, deadLetterSuffix ${deadLetterSuffix ?? 'default'}` +
      `${unsafeSocketTricks ? ', unsafeSocketTricks' : ''})`;
    describeTransportConformance(name, {
      create: async () =>
        tracked(
          await RabbitMqTransport.connect(
            URL,
            { queueType, deadLetterSuffix, maxMessageBytes: 4 * 1024 * 1024, unsafeSocketTricks },
            connectionConfig(),
          ),
        ),
      close: async (transport) => {
        await transport.close();
        await deleteQueues();
      },
      offersAbandoned: true,
    });
  }

  for (const queueType of ['classic', 'quorum'] as const) {
    describePartitionedChannelConformance(`rabbitmq (${queueType} queues)`, {
      create: async () =>
        tracked(await RabbitMqTransport.connect(URL, { queueType }, connectionConfig())),
      close: async (transport) => {
        await transport.close();
        await deleteQueues();
      },
      sharedBroker: true,
    });
  }

  // Reply queues are exclusive and auto-delete: the broker removes them, nothing to clean up.
  describeReplyChannelConformance('rabbitmq', {
    create: () =>
      RabbitMqTransport.connect(URL, { maxMessageBytes: 4 * 1024 * 1024 }, connectionConfig()),
    publishToClosed: 'rejects',
    sharedBroker: true,
  });

  describe('on a connection the application owns', () => {
    let amqp: AmqpConnection;
    let transport: RabbitMqTransport;

    beforeEach(async () => {
      amqp = new AmqpConnection({ uri: URL, ...connectionConfig() });
      await amqp.init();
    });

    afterEach(async () => {
      await transport.close();
      await amqp.close();
      await deleteQueues();
    });

    /** Replaces this test's connection, and its transport, with one to `uri` made with `config`. */
    async function reconnectWith(uri: string, config: ReturnType<typeof connectionConfig>) {
      await amqp.close();
      amqp = new AmqpConnection({ uri, ...config });
      await amqp.init();
      transport = new RabbitMqTransport(amqp);
    }

    /**
     * Has the broker close one subscription's channel, leaving the connection up, as it does on a
     * `consumer_timeout`: acking a delivery tag it never issued is a channel error (406
     * PRECONDITION_FAILED). The test reaches into the subscription for its amqplib channel.
     */
    async function breakChannelOf(subscription: Subscription): Promise<void> {
      const [{ amqp: consumerChannel }] = (
        subscription as unknown as { consumers: Array<{ amqp: amqplib.Channel }> }
      ).consumers;
      const closed = new Promise((resolve) => consumerChannel.once('close', resolve));
      consumerChannel.ack({ fields: { deliveryTag: 999_999 } } as amqplib.Message);
      await closed;
    }

    /** Has the broker close this connection (only ours), as an operator or a failover would. */
    async function dropConnection(): Promise<void> {
      const { connection } = amqp.managedConnection.connection as unknown as {
        connection: { stream: Socket };
      };
      const { localAddress, localPort, remoteAddress, remotePort } = connection.stream;
      const name = `${localAddress}:${localPort} -> ${remoteAddress}:${remotePort}`;
      const disconnected = new Promise((resolve) =>
        amqp.managedConnection.once('disconnect', resolve),
      );
      expect(await closeConnectionsWhere({ name }, 'test')).toBe(1);
      await disconnected;
    }

    it.each<RabbitMqQueueType>(['classic', 'quorum'])(
      'declares the channel and its .dlq as durable %s queues that dead-letter into the .dlq',
      async (queueType) => {
        transport = new RabbitMqTransport(amqp, { queueType });
        const channel = newChannel();
        await transport.publish(channel, Buffer.from('x'), {});

        const stdout = await rabbitmqctl([
          'list_queues',
          'name',
          'type',
          'durable',
          'arguments',
          '--formatter',
          'json',
          '-q',
        ]);
        const declared = (JSON.parse(stdout) as Array<Record<string, unknown>>)
          .filter((queue) => String(queue.name).startsWith(channel))
          .sort((a, b) => String(a.name).localeCompare(String(b.name)));
        expect(declared.map(({ name, type, durable }) => ({ name, type, durable }))).toEqual([
          { name: channel, type: queueType, durable: true },
          { name: `${channel}.dlq`, type: queueType, durable: true },
        ]);
        // rabbitmqctl lists arguments as [name, type, value].
        expect(declared[0].arguments).toEqual(
          expect.arrayContaining([
            ['x-dead-letter-exchange', 'longstr', ''],
            ['x-dead-letter-routing-key', 'longstr', `${channel}.dlq`],
          ]),
        );
        // The dead-letter queue is the end of the line: no dead-letter settings of its own.
        expect(JSON.stringify(declared[1].arguments)).not.toContain('x-dead-letter');
      },
    );

    it('dead-lettering and subscribing to a dead-letter queue create no queue behind it', async () => {
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      const subscription = await transport.subscribe(channel, async () => ({
        action: 'dead-letter',
        reason: 'test: poison',
      }));
      await transport.publish(channel, Buffer.from('poison'), {});
      const dead: InboundMessage[] = [];
      const dlq = await transport.subscribe(`${channel}.dlq`, async (message) => {
        dead.push(message);
        return { action: 'ack' };
      });
      await eventually(() => dead.length === 1, 'the dead letter');
      await subscription.close();
      await dlq.close();

      expect(await queueExists(`${channel}.dlq`)).toBe(true);
      expect(await queueExists(`${channel}.dlq.dlq`)).toBe(false);
    });

    it.each<RabbitMqQueueType>(['classic', 'quorum'])(
      'a message the broker dead-letters (rejected without requeue) lands in .dlq, on %s queues',
      async (queueType) => {
        transport = new RabbitMqTransport(amqp, { queueType });
        const channel = newChannel();
        await transport.publish(channel, Buffer.from([0, 1, 2, 255]), { 'x-n': 7 });

        // A plain AMQP client rejects it; the queue's dead-letter settings do the rest.
        const raw = await admin.createChannel();
        const message = await raw.get(channel);
        expect(message).not.toBe(false);
        raw.nack(message as amqplib.GetMessage, false, false);
        await raw.close();

        const dead: InboundMessage[] = [];
        await transport.subscribe(`${channel}.dlq`, async (letter) => {
          dead.push(letter);
          return ACK;
        });
        await eventually(() => dead.length === 1, 'the dead letter');
        expect(dead[0].body).toEqual(Buffer.from([0, 1, 2, 255]));
        expect(dead[0].headers).toMatchObject({
          'x-n': 7,
          'x-first-death-reason': 'rejected',
          'x-first-death-queue': channel,
        });
      },
    );

    it('resumes consuming after the broker drops the connection, and redelivers what was unsettled', async () => {
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      const deliveries: InboundMessage[] = [];
      const held: Array<(disposition: Disposition) => void> = [];
      await transport.subscribe(channel, (message) => {
        deliveries.push(message);
        if (deliveries.length > 1) return Promise.resolve(ACK);
        return new Promise<Disposition>((resolve) => held.push(resolve));
      });
      await transport.publish(channel, Buffer.from('before'), {});
      await eventually(() => held.length === 1, 'the first delivery');

      await dropConnection();
      // Published while the connection is down: publish waits for it within its timeout.
      await transport.publish(channel, Buffer.from('after'), {}, { timeoutMs: 10_000 });

      const bodies = () => deliveries.map((m) => `${m.body.toString()}:${m.redelivered}`).sort();
      await eventually(() => deliveries.length === 3, 'the redelivery and the new message');
      expect(bodies()).toEqual(['after:false', 'before:false', 'before:true']);

      // The verdict on the lost channel's delivery is ignored, and the subscription still works.
      held[0](ACK);
      await transport.publish(channel, Buffer.from('later'), {});
      await eventually(() => deliveries.length === 4, 'the next message');
      expect(deliveries[3].body.toString()).toBe('later');
    });

    it('refuses at once a queue name AMQP cannot carry, every other publish going on', async () => {
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      await transport.publish(channel, Buffer.from('warm-up'), { n: -1 });
      // What a remote request could name as its reply channel: the prefix, then too long a name.
      const refused = transport
        .publish(`nseq.reply.${'x'.repeat(300)}`, Buffer.from('reply'), {})
        .catch((error: unknown) => error);
      const others = Array.from({ length: 50 }, (_, n) =>
        transport.publish(channel, Buffer.from(`m${n}`), { n }),
      );
      await Promise.all(others);
      const error = await refused;
      expect(error).toBeInstanceOf(RabbitMqTopologyError);
      expect((error as RabbitMqTopologyError).replyCode).toBe(0);
      expect((error as Error).message).toMatch(/its name is 311 bytes; AMQP carries at most 255/);

      const check = await admin.createChannel();
      const { messageCount } = await check.checkQueue(channel);
      await check.close();
      expect(messageCount).toBe(51); // each once: the publishing channel was not torn down
    });

    it('takes only nseq.reply.<uuid> for a reply channel, and refuses other names of its prefix', async () => {
      transport = new RabbitMqTransport(amqp);
      expect(transport.isReplyChannel(`nseq.reply.${randomUUID()}`)).toBe(true);
      expect(transport.isReplyChannel('nseq.reply.orders')).toBe(false);
      await expect(
        transport.publish('nseq.reply.orders', Buffer.from('x'), {}),
      ).rejects.toBeInstanceOf(RabbitMqTopologyError);
    });

    it('leaves the frame writes of its connection as amqplib makes them, by default', async () => {
      transport = new RabbitMqTransport(amqp);
      await transport.publish(newChannel(), Buffer.from('first'), {});
      expect(framesCoalesced(amqp.managedConnection.connection)).toBe(false);
    });

    it('with unsafeSocketTricks, coalesces the frame writes of its connection, and of the next one after a drop', async () => {
      transport = new RabbitMqTransport(amqp, { unsafeSocketTricks: true });
      const channel = newChannel();
      await transport.publish(channel, Buffer.from('first'), {});
      const first = amqp.managedConnection.connection;
      expect(framesCoalesced(first)).toBe(true);
      expect(contentAssembledInPlace(first)).toBe(true);

      await dropConnection();
      await transport.publish(channel, Buffer.from('second'), {}, { timeoutMs: 10_000 });
      const second = amqp.managedConnection.connection;
      expect(second).not.toBe(first);
      expect(framesCoalesced(second)).toBe(true);
      expect(contentAssembledInPlace(second)).toBe(true);
    });

    it('resumes consuming on a new channel after the broker closes its channel alone', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      const received: string[] = [];
      const subscription = await transport.subscribe(channel, async (message) => {
        received.push(message.body.toString());
        return ACK;
      });
      await transport.publish(channel, Buffer.from('before'), {});
      await eventually(() => received.length === 1, 'the first message');
      const connection = amqp.managedConnection.connection;

      await breakChannelOf(subscription);
      await transport.publish(channel, Buffer.from('after'), {});

      await eventually(() => received.length === 2, 'the message published after the close');
      expect(received).toEqual(['before', 'after']);
      // Not a reconnect: the same connection carries the new channel.
      expect(amqp.managedConnection.connection).toBe(connection);
      expect(warn).toHaveBeenCalledWith(expect.stringMatching(/unknown delivery tag.*opens in/));
      warn.mockRestore();
    });

    /** The consumers of a queue, -1 while it does not exist (a failed check closes its channel). */
    async function consumersOf(queue: string): Promise<number> {
      const check = await admin.createChannel();
      check.on('error', () => undefined);
      try {
        return (await check.checkQueue(queue)).consumerCount;
      } catch {
        return -1;
      } finally {
        await check.close().catch(() => undefined);
      }
    }

    it('consumes again after an operator deletes its queue, and leaves no consumer at close', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      const received: string[] = [];
      const subscription = await transport.subscribe(channel, async (message) => {
        received.push(message.body.toString());
        return ACK;
      });
      const operator = await admin.createChannel();
      try {
        for (const round of [1, 2]) {
          await operator.deleteQueue(channel);
          await eventually(
            () => warn.mock.calls.length === round,
            `the consumer cancelled by delete ${round}`,
          );
          expect(warn).toHaveBeenLastCalledWith(
            expect.stringMatching(/broker cancelled the consumer.*resuming/),
          );
          // Declared and consumed again, by the same subscription.
          const deadline = Date.now() + 10_000;
          while ((await consumersOf(channel)) !== 1) {
            if (Date.now() > deadline) throw new Error(`no consumer after delete ${round}`);
            await new Promise((resolve) => setTimeout(resolve, 20));
          }
          await transport.publish(channel, Buffer.from(`after delete ${round}`), {});
          await eventually(() => received.length === round, `the message after delete ${round}`);
        }
        expect(received).toEqual(['after delete 1', 'after delete 2']);

        await subscription.close();
        expect(await consumersOf(channel)).toBe(0);
      } finally {
        await operator.close().catch(() => undefined);
        warn.mockRestore();
      }
    });

    it("aborts a held message's abandoned signal when the broker closes its channel, and delivers it again", async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      const received: InboundMessage[] = [];
      const subscription = await transport.subscribe(channel, (message) => {
        received.push(message);
        // The first delivery is held unsettled; the second is acked.
        return received.length === 1
          ? new Promise<Disposition>(() => undefined)
          : Promise.resolve(ACK);
      });
      await transport.publish(channel, Buffer.from('held'), {});
      await eventually(() => received.length === 1, 'the delivery');
      const first = received[0].abandoned;
      expect(first?.aborted).toBe(false);

      await breakChannelOf(subscription);

      expect(first?.aborted).toBe(true);
      await eventually(() => received.length === 2, 'the same message again, on the new channel');
      expect(received[1].body.toString()).toBe('held');
      expect(received[1].redelivered).toBe(true);
      expect(received[1].abandoned?.aborted).toBe(false);
      warn.mockRestore();
    });

    /**
     * Makes the next `createChannel` on the transport's connection open its channel on the broker
     * but hold it back from its caller until `releaseAndAwaitClose()`: a channel still opening.
     */
    function holdNextChannel() {
      const model = amqp.managedConnection.connection as unknown as amqplib.ChannelModel;
      const original = model.createChannel.bind(model);
      let release!: () => void;
      const released = new Promise<void>((resolve) => (release = resolve));
      const state: { opened?: amqplib.Channel; releaseAndAwaitClose: () => Promise<void> } = {
        /** Lets the held channel reach its caller; resolves once that channel has closed. */
        releaseAndAwaitClose: async () => {
          const closed = new Promise((resolve) => state.opened!.once('close', resolve));
          release();
          await closed;
        },
      };
      model.createChannel = async () => {
        delete (model as { createChannel?: unknown }).createChannel; // this once only
        const held = await original();
        state.opened = held;
        await released;
        return held;
      };
      return state;
    }

    /** A message published to `channel` stays in its queue: no consumer is left on it. */
    async function expectNoConsumer(channel: string): Promise<void> {
      await transport.publish(channel, Buffer.from('nobody consumes this'), {});
      const raw = await admin.createChannel();
      expect(await raw.checkQueue(channel)).toMatchObject({ consumerCount: 0, messageCount: 1 });
      await raw.close();
    }

    it('rejects subscribe with a SubscribeError when its channel cannot be opened, instead of waiting for a reconnect that never comes', async () => {
      jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
      await reconnectWith(`${URL}?channelMax=8`, connectionConfig());
      // Every channel number of the connection taken: the connection stays up, no channel opens.
      const model = amqp.managedConnection.connection as unknown as amqplib.ChannelModel;
      const taken: amqplib.Channel[] = [];
      for (;;) {
        try {
          taken.push(await model.createChannel());
        } catch {
          break;
        }
      }
      expect(taken.length).toBeGreaterThan(0);
      const channel = newChannel();
      const subscribing = transport.subscribe(channel, async () => ACK);
      await expect(subscribing).rejects.toBeInstanceOf(SubscribeError);
      await expect(subscribing).rejects.toMatchObject({ reason: 'channel-not-opened' });
      expect(amqp.managedConnection.isConnected()).toBe(true);
      // With channel numbers free again, subscribing again works.
      for (const each of taken) await each.close();
      const received: string[] = [];
      await transport.subscribe(channel, async (message) => {
        received.push(message.body.toString());
        return ACK;
      });
      await transport.publish(channel, Buffer.from('works'), {});
      await eventually(() => received.length === 1, 'the message');
      jest.restoreAllMocks();
    });

    it('rejects subscribe after subscribeTimeoutMs when its channel does not open; the late channel then closes without consuming', async () => {
      transport = new RabbitMqTransport(amqp, { subscribeTimeoutMs: 300 });
      const channel = newChannel();
      const held = holdNextChannel();
      const subscribing = transport.subscribe(channel, async () => ACK);
      await expect(subscribing).rejects.toMatchObject({
        name: 'SubscribeError',
        reason: 'timeout',
      });
      await eventually(() => held.opened !== undefined, 'the channel, open on the broker');
      await held.releaseAndAwaitClose();
      await expectNoConsumer(channel);
    });

    it('closes, rather than consumes on, a channel that finishes opening after its subscription closed', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      const subscription = await transport.subscribe(channel, async () => ACK);
      // The broker closes the channel; its replacement is held while it opens.
      const held = holdNextChannel();
      await breakChannelOf(subscription);
      await eventually(() => held.opened !== undefined, 'the new channel, open on the broker');
      await subscription.close();
      // Before, it declared, set the prefetch and consumed: a consumer nobody tracked, holding
      // up to prefetch messages unacked for the connection's lifetime.
      await held.releaseAndAwaitClose();
      await expectNoConsumer(channel);
      warn.mockRestore();
    });

    /**
     * A subscription whose first delivery is held (its verdict given later through `verdict`)
     * and whose later ones are acked; the first message is published and delivered.
     */
    async function holdingFirstDelivery() {
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      const deliveries: InboundMessage[] = [];
      const held: Array<(disposition: Disposition) => void> = [];
      const subscription = await transport.subscribe(channel, (message) => {
        deliveries.push(message);
        if (deliveries.length > 1) return Promise.resolve(ACK);
        return new Promise<Disposition>((resolve) => held.push(resolve));
      });
      await transport.publish(channel, Buffer.from('unsettled'), {});
      await eventually(() => held.length === 1, 'the first delivery');
      return { channel, deliveries, subscription, verdict: (d: Disposition) => held[0](d) };
    }

    it('redelivers on the new channel what was unsettled when the broker closed the old one', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      const { channel, deliveries, subscription, verdict } = await holdingFirstDelivery();

      await breakChannelOf(subscription);
      await eventually(() => deliveries.length === 2, 'the redelivery');
      expect(deliveries.map((m) => [m.body.toString(), m.redelivered])).toEqual([
        ['unsettled', false],
        ['unsettled', true],
      ]);

      // The verdict on the closed channel's delivery is ignored, and the new channel works.
      verdict({ action: 'requeue' });
      await transport.publish(channel, Buffer.from('next'), {});
      await eventually(() => deliveries.length === 3, 'the next message');
      expect(deliveries[2].body.toString()).toBe('next');
      warn.mockRestore();
    });

    it('does not dead-letter a delivery whose channel closed before its verdict: the broker has redelivered it', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      const { channel, deliveries, subscription, verdict } = await holdingFirstDelivery();
      await breakChannelOf(subscription);
      await eventually(() => deliveries.length === 2, 'the redelivery, handled');

      // A late dead-letter verdict on the old delivery: a copy in the DLQ would be the message
      // twice, handled once and dead-lettered once.
      verdict({ action: 'dead-letter', reason: 'late verdict' });
      await transport.publish(channel, Buffer.from('next'), {});
      await eventually(() => deliveries.length === 3, 'the next message');
      const raw = await admin.createChannel();
      const dlq = transport.deadLetterChannel(channel);
      queues.add(dlq);
      expect((await raw.checkQueue(dlq)).messageCount).toBe(0);
      await raw.close();
      warn.mockRestore();
    });

    it('returns a message to the head when its requeued copy is refused, rather than losing it', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      const deliveries: InboundMessage[] = [];
      let release!: () => void;
      const policyApplied = new Promise<void>((resolve) => (release = resolve));
      await transport.subscribe(channel, async (message) => {
        deliveries.push(message);
        if (deliveries.length > 1) return ACK;
        await policyApplied; // the copy will be published into a queue that refuses it
        return { action: 'requeue', delayMs: 10 };
      });
      await transport.publish(channel, Buffer.from('keep me'), { 'x-n': 1 });
      await eventually(() => deliveries.length === 1, 'the first delivery');

      const restore = await refuseEveryPublish(channel);
      try {
        release();

        await eventually(() => deliveries.length === 2, 'the redelivery of the original');
        // The broker's own redelivery, not a copy: no x-requeue-count.
        expect(deliveries[1].redelivered).toBe(true);
        expect(deliveries[1].headers).toEqual({ 'x-n': 1 });
        expect(warn).toHaveBeenCalledWith(
          expect.stringContaining(`could not requeue a message of ${channel} behind`),
        );
      } finally {
        await restore();
        warn.mockRestore();
      }
    });

    it('while disconnected, ping rejects with BrokerUnavailableError, publish with PublishTimeoutError, and subscribe waits; both work once reconnected', async () => {
      await reconnectWith(URL, connectionConfig(2)); // a slow reconnect
      const channel = newChannel();
      const received: string[] = [];
      const collect = async (message: InboundMessage): Promise<Disposition> => {
        received.push(`${message.channel}:${message.body.toString()}`);
        return ACK;
      };
      await transport.subscribe(channel, collect);

      await dropConnection();
      await expect(transport.ping()).rejects.toMatchObject({
        name: 'BrokerUnavailableError',
        code: 'broker-unavailable',
        transport: 'rabbitmq',
        reason: 'reconnecting',
      });
      const startedAt = Date.now();
      const lost = transport.publish(channel, Buffer.from('lost'), {}, { timeoutMs: 300 });
      await expect(lost).rejects.toBeInstanceOf(PublishTimeoutError);
      await expect(lost).rejects.toMatchObject({ channel, timeoutMs: 300 });
      expect(Date.now() - startedAt).toBeGreaterThanOrEqual(290);
      expect(Date.now() - startedAt).toBeLessThan(1_000);
      // Resolves at once and starts consuming when the connection is back.
      const late = newChannel();
      await transport.subscribe(late, collect);
      expect(amqp.connected).toBe(false);

      await transport.publish(channel, Buffer.from('after'), {}, { timeoutMs: 10_000 });
      await transport.publish(late, Buffer.from('late'), {}, { timeoutMs: 10_000 });
      await eventually(() => received.length >= 2, 'the messages after reconnecting');
      await new Promise((resolve) => setTimeout(resolve, 200)); // room for 'lost' to show up
      expect(received.sort()).toEqual([`${channel}:after`, `${late}:late`].sort());
    });

    it('settles every publish in flight by its deadline when the connection drops and stays down past it', async () => {
      await reconnectWith(URL, connectionConfig(4)); // back after ~4 s
      const channel = newChannel();
      await transport.publish(channel, Buffer.from('declared'), {});

      // Publishing without pause (batches of 50) until the broker has dropped the connection.
      type Result = { ok: boolean; error?: unknown; late: number };
      const inFlight: Array<Promise<Result>> = [];
      let dropped = false;
      const dropping = dropConnection().then(() => (dropped = true));
      while (!dropped) {
        for (let index = 0; index < 50; index++) {
          const deadline = Date.now() + 600;
          inFlight.push(
            transport.publish(channel, Buffer.alloc(2_000, index), {}, { timeoutMs: 600 }).then(
              () => ({ ok: true, late: Date.now() - deadline }),
              (error: unknown) => ({ ok: false, error, late: Date.now() - deadline }),
            ),
          );
        }
        await new Promise((resolve) => setImmediate(resolve));
      }
      await dropping;
      const results = await Promise.all(inFlight);

      // Confirmed, or refused with the typed error by its deadline: none waits for the reconnect.
      const refused = results.filter((result) => !result.ok);
      expect(refused.length).toBeGreaterThan(0); // the drop did catch publishes in flight
      for (const result of refused) {
        expect(result).toMatchObject({ error: expect.any(PublishTimeoutError) });
      }
      // A publish that waited for the reconnect would settle about 3.4 s past its deadline. The
      // bound leaves room for timers firing late on a loaded machine (thousands are in flight;
      // one CI run measured 506 ms against an earlier bound of 500).
      expect(Math.max(...results.map((result) => result.late))).toBeLessThan(1_500);
      expect(amqp.connected).toBe(false);
    });

    it('with resend: false, fails a publish in flight when the connection drops at once, instead of sending it again on the next connection', async () => {
      await reconnectWith(URL, connectionConfig(4)); // back after ~4 s
      const channel = newChannel();
      await transport.publish(channel, Buffer.from('declared'), {});

      // Handed to a live connection. One published after the drop was seen is queued for the next
      // connection, where it is sent for the first time: not awaited, it would hold the test until
      // the reconnect (~4 s); the transport's close in afterEach settles it.
      type Result = { ok: boolean; error?: unknown; at: number };
      const inFlight: Array<Promise<Result>> = [];
      let droppedAt = 0;
      const dropping = dropConnection().then(() => (droppedAt = Date.now()));
      while (!droppedAt) {
        for (let index = 0; index < 50; index++) {
          const sent = amqp.connected;
          const publishing = transport
            .publish(channel, Buffer.alloc(2_000, index), {}, { timeoutMs: 10_000, resend: false })
            .then(
              () => ({ ok: true, at: Date.now() }),
              (error: unknown) => ({ ok: false, error, at: Date.now() }),
            );
          if (sent) inFlight.push(publishing);
        }
        await new Promise((resolve) => setImmediate(resolve));
      }
      await dropping;
      const handedOver = await Promise.all(inFlight);

      const refused = handedOver.filter((result) => !result.ok);
      expect(refused.length).toBeGreaterThan(0);
      for (const result of refused) {
        // It may have reached the broker: only its confirm is missing.
        expect(result.error).toBeInstanceOf(PublishTimeoutError);
        expect(result.error).toMatchObject({ maybeSent: true });
      }
      // Every one settled with the drop, none ~4 s later on the next connection (resending would
      // have sent the unconfirmed ones again there, and had them confirmed).
      expect(Math.max(...handedOver.map((result) => result.at)) - droppedAt).toBeLessThan(1_500);
    });

    it('with resend: false, fails a message returned as unroutable instead of declaring its queue again', async () => {
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      await transport.publish(channel, Buffer.from('declares the queue'), {});
      const operator = await admin.createChannel();
      await operator.deleteQueue(channel);

      const once = transport.publish(channel, Buffer.from('returned'), {}, { resend: false });
      await expect(once).rejects.toThrow(PublishRejectedError);
      await expect(once).rejects.toThrow(/returned as unroutable/);
      // The queue is declared again by the next publish that may be resent.
      await transport.publish(channel, Buffer.from('after'), {}, { timeoutMs: 5_000 });
      const kept = await operator.get(channel, { noAck: true });
      await operator.close();
      expect(kept && kept.content.toString()).toBe('after');
    });

    it.each([Number.NaN, 0, -5, 2 ** 31])(
      'refuses a publish timeoutMs of %p',
      async (timeoutMs) => {
        transport = new RabbitMqTransport(amqp);
        await expect(
          transport.publish(newChannel(), Buffer.from('x'), {}, { timeoutMs }),
        ).rejects.toThrow(/timeoutMs must be a number of milliseconds from 1 to 2147483647/);
      },
    );

    it('rejects with PublishRejectedError when the broker nacks the message', async () => {
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      await transport.publish(channel, Buffer.from('declares the queue'), {});
      const restore = await refuseEveryPublish(channel);
      try {
        let outcome: unknown;
        // Publish until the broker refuses (the queue's process may take the policy a moment later
        // than rabbitmqctl lists it).
        const deadline = Date.now() + 5_000;
        while (!(outcome instanceof PublishRejectedError) && Date.now() < deadline) {
          outcome = await transport
            .publish(channel, Buffer.from('refused'), {})
            .catch((error: unknown) => error);
        }
        expect(outcome).toBeInstanceOf(PublishRejectedError);
        expect(outcome).toMatchObject({ channel, code: 'publish-rejected' });
      } finally {
        await restore();
      }
    });

    it('declares a queue again when it was deleted while connected, rather than lose the message', async () => {
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      await transport.publish(channel, Buffer.from('declares the queue'), {});
      const operator = await admin.createChannel();
      await operator.deleteQueue(channel);
      // Without `mandatory`, the broker would confirm this one and drop it: no queue takes it.
      await transport.publish(channel, Buffer.from('after the delete'), {}, { timeoutMs: 5_000 });
      const kept = await operator.get(channel, { noAck: true });
      await operator.close();
      expect(kept && kept.content.toString()).toBe('after the delete');
    });

    it('refuses a message over maxMessageBytes before it reaches the broker', async () => {
      transport = new RabbitMqTransport(amqp, { maxMessageBytes: 1024 });
      const channel = newChannel();

      await expect(
        transport.publish(channel, Buffer.alloc(2048), { 'x-n': 1 }),
      ).rejects.toBeInstanceOf(MessageTooLargeError);
      // Nothing was sent: not even the channel's queue was declared.
      const raw = await admin.createChannel();
      raw.on('error', () => undefined);
      await expect(raw.checkQueue(channel)).rejects.toMatchObject({ code: 404 });
    });

    /**
     * A channel whose dead-letter queue refuses every dead letter: `<channel>.plain` exists
     * without the dead-letter settings the transport declares, so declaring it fails (406).
     */
    async function withUnusableDeadLetterQueue(): Promise<{ channel: string; unusable: string }> {
      const channel = newChannel();
      const unusable = `${channel}.plain`;
      queues.add(unusable);
      const raw = await admin.createChannel();
      await raw.assertQueue(unusable, { durable: true });
      await raw.close();
      return { channel, unusable };
    }

    it('requeues instead of losing a message whose dead letter cannot be published', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      transport = new RabbitMqTransport(amqp);
      const { channel, unusable } = await withUnusableDeadLetterQueue();

      const deliveries: InboundMessage[] = [];
      await transport.subscribe(
        channel,
        async (message) => {
          deliveries.push(message);
          return deliveries.length === 1 ? { action: 'dead-letter', reason: 'bad: test' } : ACK;
        },
        { deadLetterChannel: unusable },
      );
      await transport.publish(channel, Buffer.from('keep me'), {});

      await eventually(() => deliveries.length === 2, 'the redelivery');
      expect(deliveries.map((m) => m.redelivered)).toEqual([false, true]);
      expect(warn).toHaveBeenCalledWith(expect.stringContaining(`to ${unusable} (bad: test)`));
      warn.mockRestore();
    });

    it('opens no publishing channel after close(), for a publish whose declaration was in flight', async () => {
      transport = new RabbitMqTransport(amqp);
      const publishing = transport.publish(newChannel(), Buffer.from('late'), {});
      const closing = transport.close();
      await expect(publishing).rejects.toThrow();
      await closing;
      expect(
        (transport as unknown as { publisherChannel?: unknown }).publisherChannel,
      ).toBeUndefined();
    });

    it('requeues a message whose dead letter keeps failing after a pause, not straight back', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      transport = new RabbitMqTransport(amqp);
      const { channel, unusable } = await withUnusableDeadLetterQueue();

      const seenAt: number[] = [];
      await transport.subscribe(
        channel,
        async () => {
          seenAt.push(Date.now());
          return { action: 'dead-letter', reason: 'poison: always' };
        },
        { deadLetterChannel: unusable },
      );
      await transport.publish(channel, Buffer.from('poison'), {});

      await eventually(() => seenAt.length >= 2, 'a second delivery', 5_000);
      // Straight back, the handler would have seen it dozens of times by now.
      expect(seenAt[1] - seenAt[0]).toBeGreaterThanOrEqual(FAILED_FORWARD_PAUSE_MS - 50);
      warn.mockRestore();
    });

    it('refuses a channel whose queue exists with another type, saying what to do', async () => {
      transport = new RabbitMqTransport(amqp, { queueType: 'classic' });
      const channel = newChannel();
      await new RabbitMqTransport(amqp, { queueType: 'quorum' }).publish(
        channel,
        Buffer.from('q'),
        {},
      );

      const subscribing = transport.subscribe(channel, async () => ACK);
      await expect(subscribing).rejects.toBeInstanceOf(RabbitMqTopologyError);
      await expect(subscribing).rejects.toMatchObject({ queue: channel, replyCode: 406 });
      await expect(transport.publish(channel, Buffer.from('c'), {})).rejects.toThrow(/queueType/);
    });

    it('refuses headers amqplib cannot encode before they reach the channel; the confirms of later messages stay theirs', async () => {
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      await transport.publish(channel, Buffer.from('first'), {});
      // Each of these makes amqplib throw while encoding, after it queued the confirm callback:
      // unchecked, the channel would credit every later confirm to the message before it.
      const unencodable: HeaderMap[] = [
        { n: Number.NaN },
        { n: 2 ** 50 + 0.5 },
        { ['k'.repeat(256)]: 1 },
        { big: 'x'.repeat(61 * 1024) },
      ];
      for (const headers of unencodable) {
        await expect(
          transport.publish(channel, Buffer.from('bad'), headers, { timeoutMs: 2_000 }),
        ).rejects.toBeInstanceOf(InvalidHeaderError);
      }
      await Promise.all(
        ['a', 'b', 'c'].map((body) =>
          transport.publish(channel, Buffer.from(body), { body }, { timeoutMs: 5_000 }),
        ),
      );
      const raw = await admin.createChannel();
      expect((await raw.checkQueue(channel)).messageCount).toBe(4);
      await raw.close();
    });

    it('close() does not wait past publishTimeoutMs for a subscription whose channel close is never answered', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      transport = new RabbitMqTransport(amqp, { publishTimeoutMs: 200 });
      const subscription = await transport.subscribe(newChannel(), async () => ACK);
      // A broker that never answers the channel's close (a connection it blocks, say).
      const closeForReal = subscription.close.bind(subscription);
      subscription.close = () => new Promise<void>(() => undefined);
      // Before, transport.close() (and the application's shutdown) waited for it forever.
      await transport.close();
      expect(warn).toHaveBeenCalledWith(
        expect.stringMatching(/subscriptions still closing after 200 ms; not awaited/),
      );
      await closeForReal();
      warn.mockRestore();
    });

    /** The reply queues the broker holds now, with the properties that make them temporary. */
    async function replyQueues(): Promise<Array<Record<string, unknown>>> {
      const stdout = await rabbitmqctl([
        'list_queues',
        'name',
        'type',
        'durable',
        'auto_delete',
        'exclusive',
        'arguments',
        '--formatter',
        'json',
        '-q',
      ]);
      return (JSON.parse(stdout) as Array<Record<string, unknown>>).filter((queue) =>
        String(queue.name).startsWith('nseq.reply.'),
      );
    }

    /**
     * Expects the broker to have deleted `queue` within a second: the broker deletes a queue a
     * moment after what ended it (as `rabbitmqctl list_queues`, which this replaces, took a second
     * to start before it looked).
     */
    async function expectGone(queue: string): Promise<void> {
      const deadline = Date.now() + 1_000;
      while ((await queueExists(queue)) && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      expect(await queueExists(queue)).toBe(false);
    }

    it('declares a reply channel as an exclusive, auto-delete classic queue with no dead-letter queue', async () => {
      transport = new RabbitMqTransport(amqp, { queueType: 'quorum' });
      const replies = await transport.openReplyChannel(async () => ACK);

      expect(replies.channel).toMatch(/^nseq\.reply\.[0-9a-f-]{36}$/);
      const declared = (await replyQueues()).filter((queue) =>
        String(queue.name).startsWith(replies.channel),
      );
      expect(declared).toEqual([
        expect.objectContaining({
          name: replies.channel,
          type: 'classic',
          durable: false,
          auto_delete: true,
          exclusive: true,
        }),
      ]);
      expect(JSON.stringify(declared[0].arguments)).not.toContain('x-dead-letter');

      await replies.close();
      await expectGone(replies.channel);
    });

    it('leaves no reply queue behind when its connection ends without the channel being closed', async () => {
      const other = new AmqpConnection({ uri: URL, ...connectionConfig() });
      await other.init();
      const requester = new RabbitMqTransport(other);
      const replies = await requester.openReplyChannel(async () => ACK);
      expect(await queueExists(replies.channel)).toBe(true);

      await other.close(); // as a process that dies: neither the channel nor the transport closed
      transport = new RabbitMqTransport(amqp);
      await expect(
        transport.publish(replies.channel, Buffer.from('x'), {}, { timeoutMs: 5_000 }),
      ).rejects.toBeInstanceOf(PublishRejectedError);
      await expectGone(replies.channel);
      await requester.close();
    });

    it('declares and consumes a reply queue again after the broker drops the connection', async () => {
      transport = new RabbitMqTransport(amqp);
      const received: InboundMessage[] = [];
      const replies = await transport.openReplyChannel(async (message) => {
        received.push(message);
        return ACK;
      });
      await transport.publish(replies.channel, Buffer.from('before'), {});
      await eventually(() => received.length === 1, 'the first reply');

      await dropConnection();
      // Published once the queue is back: a publish that finds it missing rejects, so retry.
      await eventually(() => amqp.managedConnection.isConnected(), 'the reconnect');
      let sent = false;
      while (!sent) {
        sent = await transport
          .publish(replies.channel, Buffer.from('after'), {}, { timeoutMs: 5_000 })
          .then(() => true)
          .catch((error: unknown) => {
            if (!(error instanceof PublishRejectedError)) throw error;
            return false;
          });
      }
      await eventually(() => received.length === 2, 'the reply after the reconnect');
      expect(received.map((m) => m.body.toString())).toEqual(['before', 'after']);
      expect(received[1].channel).toBe(replies.channel);
    });

    it('acks and drops a dead-lettered reply, logging the reason', async () => {
      const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
      transport = new RabbitMqTransport(amqp);
      let deliveries = 0;
      const replies = await transport.openReplyChannel(async () => {
        deliveries++;
        return { action: 'dead-letter', reason: 'unreadable reply' };
      });
      await transport.publish(replies.channel, Buffer.from('x'), {});
      await eventually(
        () => warn.mock.calls.some(([line]) => String(line).includes('unreadable reply')),
        'the warning',
      );
      expect(warn).toHaveBeenCalledWith(expect.stringContaining(replies.channel));
      expect(deliveries).toBe(1);
      warn.mockRestore();
    });

    it('close() cancels its subscriptions but leaves the AmqpConnection open', async () => {
      transport = new RabbitMqTransport(amqp);
      const channel = newChannel();
      let calls = 0;
      await transport.subscribe(channel, async () => {
        calls++;
        return ACK;
      });
      await transport.close();
      await transport.close();

      expect(amqp.connected).toBe(true);
      await expect(transport.publish(channel, Buffer.from('x'), {})).rejects.toThrow(/closed/);
      await expect(transport.subscribe(channel, async () => ACK)).rejects.toThrow(/closed/);
      // Published by the application on its connection: nobody consumes it any more.
      await amqp.managedChannel.publish('', channel, Buffer.from('x'), { timeout: 5_000 });
      const raw = await admin.createChannel();
      expect((await raw.checkQueue(channel)).messageCount).toBe(1);
      await raw.close();
      expect(calls).toBe(0);
    });
  });

  it('names dead-letter queues <channel><deadLetterSuffix>', () => {
    const amqp = new AmqpConnection({ uri: URL });
    expect(new RabbitMqTransport(amqp).deadLetterChannel('orders')).toBe('orders.dlq');
    expect(new RabbitMqTransport(amqp, { deadLetterSuffix: '.dead' }).deadLetterChannel('a')).toBe(
      'a.dead',
    );
  });

  describe('a subscribe that fails before its subscription has started', () => {
    /** The subscriptions the transport holds, which its close() closes. */
    const held = (of: RabbitMqTransport) =>
      (of as unknown as { subscriptions: Set<unknown> }).subscriptions;

    it('on a connection not initialized yet, keeps no subscription', async () => {
      const transport = new RabbitMqTransport(new AmqpConnection({ uri: URL }));
      await expect(transport.subscribe(newChannel(), async () => ACK)).rejects.toThrow(
        'not initialized',
      );
      expect(held(transport).size).toBe(0);
      await transport.close();
    });

    it('when its channel cannot be created, keeps no subscription', async () => {
      const amqp = new AmqpConnection({ uri: URL, ...connectionConfig() });
      await amqp.init();
      const transport = new RabbitMqTransport(amqp);
      const refused = jest.spyOn(amqp.managedConnection, 'createChannel').mockImplementation(() => {
        throw new Error('no channel left');
      });
      try {
        await expect(transport.subscribe(newChannel(), async () => ACK)).rejects.toThrow(
          'no channel left',
        );
        expect(held(transport).size).toBe(0);
      } finally {
        refused.mockRestore();
        await transport.close();
        await amqp.close();
      }
    });
  });

  it('connect() opens its own connection and close() closes it', async () => {
    const transport = await RabbitMqTransport.connect(URL, {}, connectionConfig());
    const own = (transport as unknown as { connection: AmqpConnection }).connection;
    expect(own.connected).toBe(true);
    await transport.close();
    expect(own.connected).toBe(false);
  });

  it('closes within about publishTimeoutMs a connection whose broker stopped answering', async () => {
    const channel = `frozen.${randomUUID()}`;
    const { proxy, url } = await FreezingProxy.toUrl(SERVERS.rabbitmq.url, 5672);
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      const own = await RabbitMqTransport.connect(
        url,
        { publishTimeoutMs: 500 },
        { connectionManagerOptions: { reconnectTimeInSeconds: 0.1 } },
      );
      await own.subscribe(channel, async () => ({ action: 'ack' }));
      await own.publish(channel, Buffer.from('opens the publishing channel'), {});
      proxy.freeze();
      const closed = own.close().then(() => 'closed');
      const late = new Promise((resolve) => setTimeout(() => resolve('still closing'), 4_000));
      expect(await Promise.race([closed, late])).toBe('closed');
      // Its connection gone too, nothing tries to connect again (which would keep the process up).
      await proxy.close();
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      const reconnects = error.mock.calls.filter(([line]) =>
        String(line).includes('Unable to establish a connection'),
      );
      expect(reconnects).toEqual([]);
    } finally {
      await proxy.close();
      warn.mockRestore();
      error.mockRestore();
      const admin = await amqpConnection();
      const adminChannel = await admin.createChannel();
      for (const queue of [channel, `${channel}.dlq`]) await adminChannel.deleteQueue(queue);
      await admin.close();
    }
  }, 30_000);

  it('connect() rejects when no broker answers, without retrying forever', async () => {
    const startedAt = Date.now();
    await expect(
      RabbitMqTransport.connect(
        'amqp://guest:guest@127.0.0.1:1',
        {},
        {
          ...connectionConfig(),
          connectionInitOptions: { timeout: 300 },
        },
      ),
    ).rejects.toThrow(/within a timeout of 300ms/);
    expect(Date.now() - startedAt).toBeLessThan(2_000);
  });

  it('has defaults, and refuses bad options with what to fix', async () => {
    const amqp = new AmqpConnection({ uri: URL });
    const transport = new RabbitMqTransport(amqp);
    expect(transport.name).toBe('rabbitmq');
    expect(transport.maxMessageBytes).toBe(16 * 1024 * 1024);
    expect(
      () => new RabbitMqTransport(amqp, { queueType: 'stream' as RabbitMqQueueType, prefetch: 0 }),
    ).toThrow(SequenceOptionsError);
    expect(() => new RabbitMqTransport(amqp, { maxMessageBytes: 0 })).toThrow(/maxMessageBytes/);
    expect(() => new RabbitMqTransport(amqp, { unsafeSocketTricks: 'yes' as never })).toThrow(
      /unsafeSocketTricks must be true or false/,
    );
    // Past a timer's range it was accepted, and then every publish failed with a RangeError.
    for (const publishTimeoutMs of [0, 1.5, 2 ** 31]) {
      expect(() => new RabbitMqTransport(amqp, { publishTimeoutMs })).toThrow(
        /publishTimeoutMs must be an integer of milliseconds from 1 to 2147483647/,
      );
    }
    for (const subscribeTimeoutMs of [0, 1.5, 2 ** 31]) {
      expect(() => new RabbitMqTransport(amqp, { subscribeTimeoutMs })).toThrow(
        /subscribeTimeoutMs must be an integer of milliseconds from 1/,
      );
    }
    await expect(transport.subscribe('x', async () => ACK, { prefetch: 70_000 })).rejects.toThrow(
      RangeError,
    );
    await expect(transport.publish('x', Buffer.from('x'), {})).rejects.toThrow(/not initialized/);
  });
});
