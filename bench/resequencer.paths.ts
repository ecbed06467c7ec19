/**
 * The two paths of the Resequencer benchmark, one round each: (a) a plain amqplib pass-through,
 * (b) RabbitMqTransport → Resequencer (RedisResequencerStore) → output channel. Each pre-loads its
 * own input queue (untimed), then times its consumer from the subscription until the output
 * queue holds every event, and reports the CPU this process, RabbitMQ and Redis spent meanwhile.
 * Its queues and Redis keys are deleted when the round ends, and at the latest when the
 * benchmark does.
 */
import { randomUUID } from 'node:crypto';
import { Test } from '@nestjs/testing';
import type * as amqp from 'amqplib';
import type { Redis } from 'ioredis';
import { MemoryResequencerStore, ResequencerService, SequenceModule } from 'nest-sequence';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { onCleanup } from './harness/cleanup';
import { CpuMeter, msPerThousand } from './harness/cpu';
import { deleteKeys, type QueueJanitor } from './harness/resources';

/** One event of the workload: a key, its sequence number, a small JSON body. */
export interface BenchEvent {
  readonly key: string;
  readonly seq: number;
  readonly body: Buffer;
}

/** What both paths share within a run. */
export interface PathContext {
  readonly amqpUrl: string;
  readonly connection: amqp.ChannelModel;
  readonly queues: QueueJanitor;
  readonly redis: Redis;
  readonly cpu: CpuMeter;
  /** Queue names and Redis prefixes of this run start with these. */
  readonly queuePrefix: string;
  readonly redisPrefix: string;
  readonly prefetch: number;
  readonly outputInFlight: number;
  readonly store: 'redis' | 'memory';
}

/** CPU milliseconds per 1,000 events during the timed part, per process. */
export interface CpuPerThousand {
  readonly node?: number;
  readonly rabbitmq?: number;
  readonly redis?: number;
}

export interface PathResult {
  readonly seconds: number;
  readonly cpu: CpuPerThousand;
  /** (b) The most events the resequencer held buffered at once (sampled every 20 ms). */
  readonly maxBuffered?: number;
}

/**
 * A channel whose 'error' event is heard: one the broker closes (an operation on a queue the
 * cleanup deleted under a stopped run) then fails its call instead of the whole connection.
 */
async function openChannel(connection: amqp.ChannelModel): Promise<amqp.Channel> {
  const channel = await connection.createChannel();
  channel.on('error', () => undefined);
  return channel;
}

async function openConfirmChannel(connection: amqp.ChannelModel): Promise<amqp.ConfirmChannel> {
  const channel = await connection.createConfirmChannel();
  channel.on('error', () => undefined);
  return channel;
}

const headersOf = (event: BenchEvent) => ({
  'x-resequence-key': event.key,
  'x-resequence-seq': event.seq,
});

function timedCpu(context: PathContext, events: number) {
  const before = context.cpu.read();
  const started = process.hrtime.bigint();
  return () => {
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    const spent = CpuMeter.spent(before, context.cpu.read());
    const cpu: CpuPerThousand = {
      node: msPerThousand(spent.own, events),
      rabbitmq: msPerThousand(spent.servers.rabbitmq, events),
      redis: msPerThousand(spent.servers.redis, events),
    };
    return { seconds, cpu };
  };
}

/**
 * Resolves when `queue` holds `count` messages. A queue not declared yet (the transport declares
 * the output on its first publish) counts as empty: checkQueue then closes its channel, so each
 * look uses a channel of its own.
 */
async function waitForCount(
  connection: amqp.ChannelModel,
  queue: string,
  count: number,
): Promise<void> {
  let current = await openChannel(connection);
  for (;;) {
    try {
      const { messageCount } = await current.checkQueue(queue);
      if (messageCount >= count) break;
    } catch {
      current = await openChannel(connection);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  await current.close();
}

/**
 * Declares `queue` and fills it with the events, the same way for both paths: the input stands
 * for an upstream's messages, so each path consumes identical messages (persistent, the two
 * headers, no other property) and only what it does with them differs. `declare`: the queue's
 * arguments, which must be those its consumer declares it with.
 */
async function preload(
  connection: amqp.ChannelModel,
  queue: string,
  events: BenchEvent[],
  declare: amqp.Options.AssertQueue = { durable: true },
): Promise<void> {
  const channel = await openConfirmChannel(connection);
  await channel.assertQueue(queue, declare);
  for (const event of events) {
    channel.sendToQueue(queue, event.body, { persistent: true, headers: headersOf(event) });
  }
  await channel.waitForConfirms();
  await channel.close();
}

/** (a) amqplib consumes the input, publishes each message to the output, acks once confirmed. */
export async function baselineRound(
  context: PathContext,
  events: BenchEvent[],
): Promise<PathResult> {
  const { connection, queues } = context;
  const input = `${context.queuePrefix}.base-in.${randomUUID().slice(0, 6)}`;
  const output = queues.track(`${input}.out`);
  queues.track(input);
  await preload(connection, input, events);
  const admin = await openConfirmChannel(connection);
  await admin.assertQueue(output, { durable: true });

  const consumer = await openChannel(connection);
  const publisher = await openConfirmChannel(connection);
  await consumer.prefetch(context.prefetch);
  const stop = timedCpu(context, events.length);
  await consumer.consume(input, (message) => {
    if (!message) return;
    publisher.sendToQueue(
      output,
      message.content,
      { persistent: true, headers: message.properties.headers },
      (error) => (error ? consumer.nack(message, false, true) : consumer.ack(message)),
    );
  });
  await waitForCount(connection, output, events.length);
  const result = stop();
  await consumer.close();
  await publisher.close();
  await admin.close();
  await queues.delete(input, output);
  return result;
}

/** (b) RabbitMqTransport → a Resequencer with its `output` channel. */
export async function moduleRound(
  context: PathContext,
  events: BenchEvent[],
  unsafeSocketTricks: boolean,
): Promise<PathResult> {
  const { connection, queues, redis } = context;
  const input = `${context.queuePrefix}.mod-in.${randomUUID().slice(0, 6)}`;
  const output = `${input}.out`;
  queues.track(input, output, `${input}.dlq`, `${output}.dlq`);
  const prefix = `${context.redisPrefix}:${randomUUID().slice(0, 6)}`;
  // Registered before the transport and the app, so that it runs after they are closed.
  const deletePrefix = onCleanup(`delete Redis keys ${prefix}:*`, async () => {
    await deleteKeys(redis, `${prefix}:*`);
  });
  const transport = await RabbitMqTransport.connect(context.amqpUrl, {
    prefetch: context.prefetch,
    unsafeSocketTricks,
  });
  const closeTransport = onCleanup('close the module transport', () => transport.close());
  const store =
    context.store === 'memory'
      ? new MemoryResequencerStore()
      : new RedisResequencerStore(redis, { prefix, unsafeSocketTricks });
  // Declared as RabbitMqTransport declares a channel's queue (a classic queue dead-lettering
  // into `<queue>.dlq`); were they to differ, its subscribe would fail with PRECONDITION_FAILED.
  await preload(connection, input, events, {
    durable: true,
    arguments: {
      'x-queue-type': 'classic',
      'x-dead-letter-exchange': '',
      'x-dead-letter-routing-key': `${input}.dlq`,
    },
  });
  const moduleRef = await Test.createTestingModule({
    imports: [
      SequenceModule.forRoot({
        transport,
        metrics: false,
        resequencer: { store, maxBufferedTotal: events.length },
        tuning: { sweepers: { gaps: { intervalMs: false } } },
      }),
    ],
  }).compile();
  const app = await moduleRef.init();
  const closeApp = onCleanup('close the module app', () => app.close());
  const resequencer = app.get(ResequencerService).create({
    channel: input,
    output,
    outputInFlight: context.outputInFlight,
    gap: { timeoutMs: 600_000, policy: 'alert' },
  });

  let maxBuffered = 0;
  const sampler = setInterval(() => {
    void store.bufferedTotal(input).then((count) => (maxBuffered = Math.max(maxBuffered, count)));
  }, 20);
  sampler.unref();
  const stop = timedCpu(context, events.length);
  const subscription = await transport.subscribe(input, (message) => resequencer.receive(message), {
    prefetch: context.prefetch,
  });
  await waitForCount(connection, output, events.length);
  const { seconds, cpu } = stop();
  clearInterval(sampler);
  await subscription.close();

  const check = await openChannel(connection);
  await verifyOrder(check, output, events.length);
  await check.close();
  await queues.delete(output, input, `${input}.dlq`, `${output}.dlq`);
  await closeApp.run();
  await closeTransport.run();
  await deletePrefix.run();
  return { seconds, maxBuffered, cpu };
}

/** Reads the output back: per key exactly 1..n, in order. */
async function verifyOrder(channel: amqp.Channel, queue: string, count: number): Promise<void> {
  const next = new Map<string, number>();
  for (let read = 0; read < count; read++) {
    const message = await channel.get(queue, { noAck: true });
    if (!message) throw new Error(`output has ${read} messages, expected ${count}`);
    const key = String(message.properties.headers?.['x-resequence-key']);
    const seq = Number(message.properties.headers?.['x-resequence-seq']);
    const expected = next.get(key) ?? 1;
    if (seq !== expected) throw new Error(`key ${key}: got ${seq} where ${expected} was due`);
    next.set(key, seq + 1);
  }
  if (await channel.get(queue, { noAck: true })) throw new Error('output holds extra messages');
}
