import { randomUUID } from 'node:crypto';
import { AmqpConnection } from '@golevelup/nestjs-rabbitmq';
import * as amqplib from 'amqplib';
import { Registry } from 'prom-client';
import { AMQP_URL, silentLogger } from '../../test/support/rabbitmq.fixture';
import { describeWithServer } from '../../test/support/servers';
import { InMemoryTransport } from '../adapters/transports/in-memory/in-memory.transport';
import { RabbitMqTransport } from '../adapters/transports/rabbitmq/rabbitmq.transport';
import type { ResolvedOptions } from '../options/resolved-options';
import type { Disposition, InboundMessage, Subscription, Transport } from '../ports/transport.port';
import type { ChannelBinding } from './channel-binding';
import { ConsumerHost } from './consumer.host';
import { DeadLetterMetrics } from './dead-letter.metrics';
import { ModuleMetrics } from './module-metrics';

const CHANNEL = 'consumer-host.dead-letters';

/** A binding whose handler gives its verdict on each message only when the test says so. */
class HeldVerdicts implements Pick<ChannelBinding, 'receive'> {
  readonly received: InboundMessage[] = [];
  private readonly verdicts: Array<(disposition: Disposition) => void> = [];

  receive(message: InboundMessage): Promise<Disposition> {
    this.received.push(message);
    return new Promise((resolve) => this.verdicts.push(resolve));
  }

  give(disposition: Disposition): void {
    this.verdicts.shift()!(disposition);
  }
}

/** Lets the verdict travel through the host and the transport (promises, then a pump). */
async function settled(): Promise<void> {
  for (let turn = 0; turn < 5; turn++) await new Promise((resolve) => setImmediate(resolve));
}

async function eventually(condition: () => boolean | Promise<boolean>, what: string) {
  const deadline = Date.now() + 10_000;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** A host (shutdownTimeoutMs 50) consuming `channel` through `handler`, and its metric. */
async function hostOn(transport: Transport, channel: string, handler: HeldVerdicts) {
  const registry = new Registry();
  const metrics = new ModuleMetrics({ metrics: { registry, prefix: 'nest_sequence_' } });
  const host = new ConsumerHost(
    transport,
    { shutdownTimeoutMs: 50 } as ResolvedOptions,
    new DeadLetterMetrics(metrics),
  );
  await host.open([
    {
      channel,
      kind: 'test',
      definedBy: 'HeldVerdicts.receive',
      prefetch: 1,
      describe: 'consumes',
      receive: (message) => handler.receive(message),
    },
  ]);
  return {
    host,
    /** `dead_letters_total`, summed over its labels. */
    async deadLettersCounted(): Promise<number> {
      const metric = await registry.getSingleMetric('nest_sequence_dead_letters_total')?.get();
      return (metric?.values ?? []).reduce((sum, { value }) => sum + value, 0);
    },
  };
}

describe('ConsumerHost: dead_letters_total', () => {
  let transport: InMemoryTransport;
  let host: ConsumerHost;
  let handler: HeldVerdicts;
  let deadLettersCounted: () => Promise<number>;

  beforeEach(async () => {
    transport = new InMemoryTransport();
    handler = new HeldVerdicts();
    ({ host, deadLettersCounted } = await hostOn(transport, CHANNEL, handler));
    await transport.publish(CHANNEL, Buffer.from('order 7'), {});
    await eventually(() => handler.received.length === 1, 'the delivery');
  });

  afterEach(async () => {
    await host.close();
    await transport.close();
  });

  it('counts a dead-letter verdict the transport carries out', async () => {
    handler.give({ action: 'dead-letter', reason: 'handler-failed: out of stock' });
    await settled();

    expect(transport.peek(`${CHANNEL}.dlq`)).toHaveLength(1);
    expect(await deadLettersCounted()).toBe(1);
  });

  it('does not count a dead-letter verdict given after shutdownTimeoutMs, once the message was handed back', async () => {
    // The drain gives up after 50 ms and closes the subscription: the message goes back to its
    // channel, for another consumer, and the delivery is abandoned.
    await host.close();
    expect(transport.depth(CHANNEL)).toBe(1);
    expect(handler.received[0].abandoned?.aborted).toBe(true);

    handler.give({ action: 'dead-letter', reason: 'handler-failed: out of stock' });
    await settled();

    expect(transport.depth(CHANNEL)).toBe(1);
    expect(transport.peek(`${CHANNEL}.dlq`)).toHaveLength(0);
    expect(await deadLettersCounted()).toBe(0);
  });
});

describe('ConsumerHost: shutdown', () => {
  it('aborts stopping once the drain is over, not before', async () => {
    const transport = new InMemoryTransport();
    const handler = new HeldVerdicts();
    const { host } = await hostOn(transport, CHANNEL, handler);
    await transport.publish(CHANNEL, Buffer.from('order 8'), {});
    await eventually(() => handler.received.length === 1, 'the delivery');

    const closing = host.close();
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(host.stopping.aborted).toBe(false); // within shutdownTimeoutMs (50 ms)
    await closing;
    expect(host.stopping.aborted).toBe(true);
    await transport.close();
  });

  it('goes on with the shutdown when a subscription does not close in time', async () => {
    // A broker that never answers the cancel (a RabbitMQ connection blocked by a resource alarm
    // still answers heartbeats): the transport's own close is what ends such a channel.
    const transport = new InMemoryTransport();
    const subscribe = transport.subscribe.bind(transport);
    let closeAsked = false;
    jest.spyOn(transport, 'subscribe').mockImplementation(async (...args) => {
      const subscription = await subscribe(...args);
      return {
        channel: subscription.channel,
        close: () => {
          closeAsked = true;
          return new Promise<void>(() => undefined);
        },
      };
    });
    const { host } = await hostOn(transport, CHANNEL, new HeldVerdicts());

    // At least 5 s: what a healthy close may take (NATS waits for its pull in flight to expire).
    const closed = await Promise.race([
      host.close().then(() => true),
      new Promise<false>((resolve) => setTimeout(() => resolve(false), 8_000)),
    ]);
    expect(closeAsked).toBe(true);
    expect(closed).toBe(true);
    await transport.close();
  }, 15_000);

  it('leaves no unhandled rejection when a binding rejects', async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.on('unhandledRejection', onUnhandled);
    const transport = new InMemoryTransport();
    const rejecting = new HeldVerdicts();
    rejecting.receive = (message) => {
      rejecting.received.push(message);
      return Promise.reject(new Error('boom'));
    };
    const { host } = await hostOn(transport, CHANNEL, rejecting);
    try {
      await transport.publish(CHANNEL, Buffer.from('order 9'), {});
      await eventually(() => rejecting.received.length >= 1, 'the delivery');
      await new Promise((resolve) => setTimeout(resolve, 20));
      expect(unhandled).toEqual([]);
    } finally {
      process.off('unhandledRejection', onUnhandled);
      await host.close();
      await transport.close();
    }
  });
});

describeWithServer('rabbitmq', 'ConsumerHost on RabbitMQ: dead_letters_total', () => {
  let amqp: AmqpConnection;
  let admin: amqplib.ChannelModel;
  let transport: RabbitMqTransport;
  let host: ConsumerHost | undefined;
  const channel = `consumer-host.${randomUUID()}`;

  beforeAll(async () => {
    admin = await amqplib.connect(AMQP_URL);
    amqp = new AmqpConnection({
      uri: AMQP_URL,
      logger: silentLogger,
      enableDirectReplyTo: false,
      registerHandlers: false,
      connectionManagerOptions: { reconnectTimeInSeconds: 0.2 },
    });
    await amqp.init();
    transport = new RabbitMqTransport(amqp);
  });

  afterAll(async () => {
    await host?.close();
    await transport?.close();
    await amqp?.close();
    const cleanup = await admin.createChannel();
    for (const queue of [channel, transport.deadLetterChannel(channel)]) {
      await cleanup.deleteQueue(queue);
    }
    await admin.close();
  });

  it('counts once a message whose first dead-letter verdict came after the broker took it back', async () => {
    const subscriptions: Subscription[] = [];
    const subscribe = transport.subscribe.bind(transport);
    transport.subscribe = async (...args) => {
      const subscription = await subscribe(...args);
      subscriptions.push(subscription);
      return subscription;
    };
    const handler = new HeldVerdicts();
    let deadLettersCounted: () => Promise<number>;
    ({ host, deadLettersCounted } = await hostOn(transport, channel, handler));
    await transport.publish(channel, Buffer.from('order 8'), {});
    await eventually(() => handler.received.length === 1, 'the first delivery');

    // The broker closes the consumer's channel (a consumer_timeout does), the connection stays:
    // it puts the message back and delivers it again on the subscription's next channel.
    const [{ amqp: consumerChannel }] = (
      subscriptions[0] as unknown as { consumers: Array<{ amqp: amqplib.Channel }> }
    ).consumers;
    consumerChannel.ack({ fields: { deliveryTag: 999_999 } } as amqplib.Message);
    await eventually(() => handler.received.length === 2, 'the message delivered again');
    expect(handler.received[0].abandoned?.aborted).toBe(true);

    // The verdict on the first delivery comes late: the transport ignores it. The second one
    // dead-letters the message.
    handler.give({ action: 'dead-letter', reason: 'handler-failed: out of stock' });
    handler.give({ action: 'dead-letter', reason: 'handler-failed: out of stock' });

    const inspect = await admin.createChannel();
    const dlq = transport.deadLetterChannel(channel);
    await eventually(
      async () => (await inspect.checkQueue(dlq)).messageCount >= 1,
      'the dead letter',
    );
    await new Promise((resolve) => setTimeout(resolve, 200)); // room for a second one to show
    expect((await inspect.checkQueue(dlq)).messageCount).toBe(1);
    expect((await inspect.checkQueue(channel)).messageCount).toBe(0);
    await inspect.close();
    expect(await deadLettersCounted()).toBe(1);
  });
});
