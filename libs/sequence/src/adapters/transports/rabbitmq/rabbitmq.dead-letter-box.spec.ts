import { randomUUID } from 'node:crypto';
import type { LoggerService } from '@nestjs/common';
import type * as amqplib from 'amqplib';
import { describeDeadLetterBoxConformance } from '../../../testing/conformance/dead-letter-box.conformance';
import { describeWithServer, SERVERS } from '../../../../test/support/servers';
import { amqpConnection } from '../../../../test/support/rabbitmq.fixture';
import { eventually } from '../../../testing/conformance/transport.conformance';
import type { InboundMessage, Transport } from '../../../ports/transport.port';
import type { RabbitMqQueueType } from './rabbitmq.options';
import { UNLIMITED_DELIVERIES } from './rabbitmq.topology';
import { RabbitMqTransport } from './rabbitmq.transport';

const silent: LoggerService = {
  log: () => undefined,
  error: () => undefined,
  warn: () => undefined,
};

describeWithServer('rabbitmq', 'RabbitMqTransport dead letters', () => {
  /** Every queue a test may have created; deleted after each test. */
  const queues = new Set<string>();
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
    await channel.close();
  }

  /** The transport, recording the queues behind every channel it publishes or subscribes to. */
  function tracked(transport: RabbitMqTransport): Transport {
    const track = (channel: string) =>
      queues.add(channel).add(transport.deadLetterChannel(channel));
    return new Proxy(transport, {
      get(target, property) {
        if (property === 'publish' || property === 'subscribe') {
          return (channel: string, ...rest: unknown[]) => {
            track(channel);
            return (target[property] as (...args: unknown[]) => unknown).call(
              target,
              channel,
              ...rest,
            );
          };
        }
        const value: unknown = Reflect.get(target, property, target);
        return typeof value === 'function' ? (value as () => unknown).bind(target) : value;
      },
    });
  }

  for (const queueType of ['classic', 'quorum'] as RabbitMqQueueType[]) {
    describeDeadLetterBoxConformance(`rabbitmq (${queueType} queues)`, {
      create: async () =>
        tracked(
          await RabbitMqTransport.connect(
            SERVERS.rabbitmq.url,
            { queueType, maxMessageBytes: 64 * 1024 },
            { logger: silent, enableDirectReplyTo: false, registerHandlers: false },
          ),
        ),
      close: async (transport) => {
        await transport.close();
        await deleteQueues();
      },
      // A quorum queue re-enqueues what is put back when it gets to it: a browse that follows
      // another closely, or a message that arrives meanwhile, can come before it.
      browseKeepsOrder: queueType === 'classic',
    });
  }

  describe('dead letters the broker routed, and messages without a message id', () => {
    let transport: Transport;

    beforeEach(async () => {
      transport = tracked(
        await RabbitMqTransport.connect(
          SERVERS.rabbitmq.url,
          {},
          { logger: silent, enableDirectReplyTo: false, registerHandlers: false },
        ),
      );
    });

    afterEach(async () => {
      await transport.close();
      await deleteQueues();
    });

    it('names the broker reason, ids messages by content, and replays without the broker records', async () => {
      const channel = `rmq-dlq.${randomUUID()}`;
      const deadLetters = transport.deadLetterChannel(channel);
      await transport.publish(channel, Buffer.from('rejected'), { 'x-user': 'u' });
      const amqp = await admin.createChannel();
      try {
        // Rejected without requeue: the broker dead-letters it through the queue's DLX.
        const got = await amqp.get(channel, { noAck: false });
        if (got === false) throw new Error('the message is not in its queue');
        amqp.nack(got, false, false);
        // Two identical messages of another program: no message id.
        for (let i = 0; i < 2; i++) {
          amqp.sendToQueue(deadLetters, Buffer.from('same'), {
            headers: { 'x-death-reason': 'x: y' },
          });
        }
        await amqp.close();
      } catch (error) {
        await amqp.close().catch(() => undefined);
        throw error;
      }
      const box = transport.deadLetters!();
      let page = await box.browse(channel, { limit: 10 });
      for (let tries = 0; page.items.length < 3 && tries < 100; tries++) {
        await new Promise((resolve) => setTimeout(resolve, 20));
        page = await box.browse(channel, { limit: 10 });
      }

      const [rejected, same, again] = page.items;
      expect(page.total).toBe(3);
      expect(rejected.reason).toBe(`rejected: dead-lettered by RabbitMQ from ${channel}`);
      expect(typeof rejected.deadLetteredAt).toBe('number');
      expect(rejected.headers['x-death']).toBeDefined();
      expect(same.reason).toBe('x: y');
      expect(again.id).toBe(`${same.id}~2`);

      const replayed: InboundMessage[] = [];
      await transport.subscribe(channel, async (message) => {
        replayed.push(message);
        return { action: 'ack' };
      });
      const result = await box.replay(channel, [rejected.id, same.id, again.id], {
        ratePerSecond: 100,
      });

      expect(result).toEqual({ done: [rejected.id, same.id, again.id], missing: [], failed: [] });
      await eventually(() => replayed.length === 3, 'the replays');
      const first = replayed.find((message) => message.body.toString() === 'rejected')!;
      expect(first.headers['x-user']).toBe('u');
      expect(first.headers['x-replay-count']).toBe(1);
      for (const name of Object.keys(first.headers))
        expect(name).not.toMatch(/^x-(death|first-death|last-death)/);
      expect((await box.browse(channel, { limit: 10 })).items).toEqual([]);
    });

    it('replays every one of identical dead letters at one a round, none left as missing', async () => {
      const channel = `rmq-dlq.${randomUUID()}`;
      const deadLetters = transport.deadLetterChannel(channel);
      await transport.publish(channel, Buffer.from('declares'), {});
      const amqp = await admin.createChannel();
      await amqp.purgeQueue(channel);
      // Three identical messages of another program: ids `h-…`, `h-…~2`, `h-…~3`.
      for (let i = 0; i < 3; i++) {
        amqp.sendToQueue(deadLetters, Buffer.from('same'), {
          headers: { 'x-death-reason': 'x: y' },
        });
      }
      await amqp.close();
      const box = transport.deadLetters!();
      let page = await box.browse(channel, { limit: 10 });
      for (let tries = 0; page.items.length < 3 && tries < 100; tries++) {
        await new Promise((resolve) => setTimeout(resolve, 20));
        page = await box.browse(channel, { limit: 10 });
      }
      const ids = page.items.map((item) => item.id);

      // One a round at this rate: a round numbers what it reads afresh.
      const result = await box.replay(channel, ids, { ratePerSecond: 1 });

      expect(result).toEqual({ done: ids, missing: [], failed: [] });
      expect(await box.count(channel)).toBe(0);
    });

    it("lists and replays another program's dead letter whose table String() cannot convert", async () => {
      const channel = `rmq-dlq.${randomUUID()}`;
      await transport.publish(channel, Buffer.from('declares both queues'), {});
      const amqp = await admin.createConfirmChannel();
      // A legal AMQP table; amqplib decodes it into an object whose own toString is a string.
      amqp.sendToQueue(transport.deadLetterChannel(channel), Buffer.from('odd'), {
        headers: { meta: { toString: 'x' }, 'x-death-reason': 'no-handler' },
      });
      await amqp.waitForConfirms();
      await amqp.close();

      const box = transport.deadLetters!();
      let page = await box.browse(channel, { limit: 10 });
      for (let tries = 0; page.items.length < 1 && tries < 100; tries++) {
        await new Promise((resolve) => setTimeout(resolve, 20));
        page = await box.browse(channel, { limit: 10 });
      }
      expect(page.items).toHaveLength(1);
      expect(page.items[0]).toMatchObject({
        reason: 'no-handler',
        headers: { meta: { toString: 'x' } },
      });

      const replayed: InboundMessage[] = [];
      await transport.subscribe(channel, async (message) => {
        replayed.push(message);
        return { action: 'ack' };
      });
      const result = await box.replay(channel, [page.items[0].id], { ratePerSecond: 100 });
      expect(result).toEqual({ done: [page.items[0].id], missing: [], failed: [] });
      await eventually(
        () => replayed.some((message) => message.body.toString() === 'odd'),
        'the replay',
      );
    });
  });
  describe('quorum dead-letter queues', () => {
    it('are declared with no effective delivery limit, so browsing never drops a dead letter', async () => {
      const transport = tracked(
        await RabbitMqTransport.connect(
          SERVERS.rabbitmq.url,
          { queueType: 'quorum' },
          { logger: silent, enableDirectReplyTo: false, registerHandlers: false },
        ),
      );
      try {
        const channel = `rmq-dlq-limit.${randomUUID()}`;
        const deadLetters = transport.deadLetterChannel(channel);
        await transport.publish(channel, Buffer.from('x'), {});
        const amqp = await admin.createChannel();
        amqp.on('error', () => undefined);
        // The broker refuses a redeclaration whose delivery limit differs (406).
        await expect(
          amqp.assertQueue(deadLetters, {
            durable: true,
            arguments: { 'x-queue-type': 'quorum', 'x-delivery-limit': UNLIMITED_DELIVERIES },
          }),
        ).resolves.toMatchObject({ queue: deadLetters });
        await amqp.close();
      } finally {
        await transport.close();
        await deleteQueues();
      }
    });
  });
});
