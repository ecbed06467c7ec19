import { randomUUID } from 'node:crypto';
import type * as amqplib from 'amqplib';
import { describeWithServer } from '../../../../test/support/servers';
import { amqpConnection } from '../../../../test/support/rabbitmq.fixture';
import { PublishTimeoutError } from '../../../core/errors/publish-timeout.error';
import type { HeaderMap } from '../../../core/headers';
import type { BrokerConnection } from './amqp.types';
import { RabbitMqDeadLetterBox, type RabbitMqDeadLetterAccess } from './rabbitmq.dead-letter-box';

/** The RabbitMQ box when the broker or its channels fail part-way through an action. */
describeWithServer('rabbitmq', 'RabbitMqDeadLetterBox failures', () => {
  let admin: amqplib.ChannelModel;
  let channel: string;
  let queue: string;
  let setup: amqplib.ConfirmChannel;

  beforeAll(async () => {
    admin = await amqpConnection();
  });

  afterAll(async () => {
    await admin.close();
  });

  beforeEach(async () => {
    channel = `rmq-dlq-fail.${randomUUID()}`;
    queue = `${channel}.dlq`;
    setup = await admin.createConfirmChannel();
    await setup.assertQueue(channel, { durable: false });
    await setup.assertQueue(queue, { durable: false });
  });

  afterEach(async () => {
    await setup.deleteQueue(channel);
    await setup.deleteQueue(queue);
    await setup.close();
  });

  async function deadLetter(messageId: string): Promise<void> {
    setup.sendToQueue(queue, Buffer.from(messageId), {
      messageId,
      headers: { 'x-death-reason': 'test: failure paths' },
    });
    await setup.waitForConfirms();
  }

  /** Publishes straight to the channel's queue, confirmed. */
  async function publish(target: string, body: Buffer, headers: HeaderMap): Promise<void> {
    setup.sendToQueue(target, body, { headers });
    await setup.waitForConfirms();
  }

  function access(overrides: Partial<RabbitMqDeadLetterAccess>): RabbitMqDeadLetterAccess {
    return {
      connection: () => admin,
      publish,
      deadLetterChannel: (name) => `${name}.dlq`,
      ...overrides,
    };
  }

  it('keeps what earlier rounds did when a later round cannot open its channel', async () => {
    await deadLetter('first');
    await deadLetter('second');
    let sessions = 0;
    const box = new RabbitMqDeadLetterBox(
      access({
        connection: () => {
          sessions += 1;
          if (sessions > 1) throw new Error('no connection');
          return admin;
        },
      }),
    );

    // One replay per round at 1 per second: two rounds, the second without a connection.
    const result = await box.replay(channel, ['first', 'second'], { ratePerSecond: 1 });

    expect(result.done).toEqual(['first']);
    expect(result.failed).toEqual([{ id: 'second', error: 'no connection' }]);
    expect(result.missing).toEqual([]);
  });

  it('reports a replay whose dead letter could not be removed as uncertain, not failed', async () => {
    await deadLetter('only');
    const opened: amqplib.Channel[] = [];
    const box = new RabbitMqDeadLetterBox(
      access({
        connection: () =>
          ({
            createChannel: async () => {
              const amqp = await admin.createChannel();
              opened.push(amqp);
              return amqp;
            },
          }) as unknown as BrokerConnection,
        // The publish is confirmed, then the box's channel closes before its ack.
        publish: async (target, body, headers) => {
          await publish(target, body, headers);
          await opened.at(-1)!.close();
        },
      }),
    );

    const result = await box.replay(channel, ['only'], { ratePerSecond: 100 });

    expect(result.done).toEqual([]);
    expect(result.failed).toEqual([]);
    expect(result.uncertain).toEqual([
      { id: 'only', error: expect.stringContaining('do not replay it again') as string },
    ]);
    const copy = await setup.get(channel, { noAck: true });
    expect(copy && copy.properties.headers?.['x-message-id']).toBe('only');
    // Closing the channel put the dead letter back: it is still there, as the answer warns.
    expect((await setup.checkQueue(queue)).messageCount).toBe(1);
  });

  it('reports a replay whose confirm never came as uncertain, and keeps the dead letter', async () => {
    await deadLetter('only');
    const box = new RabbitMqDeadLetterBox(
      access({
        // Handed to the broker, which may have stored it: only the confirm is missing.
        publish: async (target, body, headers) => {
          await publish(target, body, headers);
          throw new PublishTimeoutError(target, 50, true);
        },
      }),
    );

    const result = await box.replay(channel, ['only'], { ratePerSecond: 100 });

    expect(result.done).toEqual([]);
    expect(result.failed).toEqual([]);
    expect(result.uncertain).toEqual([
      { id: 'only', error: expect.stringContaining('was not confirmed within 50 ms') as string },
    ]);
    expect(result.uncertain?.[0]?.error).toContain(
      'check whether it was delivered before you replay it again',
    );
    expect((await setup.checkQueue(queue)).messageCount).toBe(1);
  });

  it('reports a replay that never reached the broker as failed', async () => {
    await deadLetter('only');
    const box = new RabbitMqDeadLetterBox(
      access({
        publish: () => Promise.reject(new PublishTimeoutError(channel, 50, false)),
      }),
    );

    const result = await box.replay(channel, ['only'], { ratePerSecond: 100 });

    expect(result.failed).toEqual([
      { id: 'only', error: expect.stringContaining('was not confirmed') as string },
    ]);
    expect(result.uncertain).toBeUndefined();
    expect((await setup.checkQueue(queue)).messageCount).toBe(1);
  });

  it('counts the dead letters without taking any', async () => {
    await deadLetter('a');
    await deadLetter('b');
    const box = new RabbitMqDeadLetterBox(access({}));

    expect(await box.count(channel)).toBe(2);
    expect(await box.count(`${channel}-none`)).toBe(0);
    const first = await setup.get(queue, { noAck: true });
    // Never delivered: a browse would have left it flagged redelivered.
    expect(first && first.fields.redelivered).toBe(false);
  });
});
