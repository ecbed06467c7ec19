/**
 * RabbitMQ helpers of the Outbox benchmark: queues declared exactly as RabbitMqTransport declares
 * them (so every path publishes to the same kind of queue), waiting for a queue to fill, a
 * consumer that notes when each message arrived, and cleanup.
 */
import type * as amqp from 'amqplib';
import { QueueJanitor } from './harness/resources';
import { cpuNow, cpuPerThousand, type CpuPerThousand } from './outbox.cpu';
import { nowMs, queueName, settings, sleep } from './outbox.settings';

const DLQ_SUFFIX = '.dlq';

/**
 * Every queue declared in this run: deleted after its measurement, and at the latest when the
 * benchmark ends (also after a failure or Ctrl-C). Made when this module loads, so that its sweep
 * runs after every other cleanup step, once the apps that could declare queues are closed.
 */
const queues = new QueueJanitor(settings.amqpUrl, `${queueName('*')}`);

/**
 * A channel whose 'error' event is heard: an operation the broker refuses (on a queue deleted
 * under us, after Ctrl-C) then rejects its call instead of crashing the process.
 */
async function openChannel(connection: amqp.ChannelModel): Promise<amqp.Channel> {
  const channel = await connection.createChannel();
  channel.on('error', () => undefined);
  return channel;
}

/**
 * Declares `queue` (durable, classic, dead-lettering to `<queue>.dlq`) and its dead-letter queue,
 * with the arguments RabbitMqTransport's topology uses: its own declaration then matches.
 */
export async function declareQueue(connection: amqp.ChannelModel, queue: string): Promise<void> {
  queues.track(queue, `${queue}${DLQ_SUFFIX}`);
  const channel = await openChannel(connection);
  await channel.assertQueue(`${queue}${DLQ_SUFFIX}`, {
    durable: true,
    arguments: { 'x-queue-type': 'classic' },
  });
  await channel.assertQueue(queue, {
    durable: true,
    arguments: {
      'x-queue-type': 'classic',
      'x-dead-letter-exchange': '',
      'x-dead-letter-routing-key': `${queue}${DLQ_SUFFIX}`,
    },
  });
  await channel.close();
}

/** Deletes `queue` and its dead-letter queue; one that fails stays for the final sweep. */
export async function deleteQueue(queue: string): Promise<void> {
  await queues.delete(queue, `${queue}${DLQ_SUFFIX}`).catch(() => undefined);
}

export async function messageCount(connection: amqp.ChannelModel, queue: string): Promise<number> {
  const channel = await openChannel(connection);
  try {
    return (await channel.checkQueue(queue)).messageCount;
  } finally {
    await channel.close().catch(() => undefined);
  }
}

/**
 * Resolves with the time (`nowMs`) at which `queue` was first seen holding `count` messages. It
 * polls every 10 ms, and every 1/1000 of the time elapsed once that is longer (at most 50 ms):
 * the clock's resolution stays within 0.1% while long runs do not load the broker with checks.
 * Rejects after `stallTimeoutMs` without progress.
 */
export async function waitForCount(
  connection: amqp.ChannelModel,
  queue: string,
  count: number,
  stallTimeoutMs = 60_000,
): Promise<number> {
  const channel = await openChannel(connection);
  const started = nowMs();
  let last = -1;
  let lastChange = started;
  try {
    for (;;) {
      const { messageCount: current } = await channel.checkQueue(queue);
      const at = nowMs();
      if (current >= count) return at;
      if (current !== last) {
        last = current;
        lastChange = at;
      } else if (at - lastChange > stallTimeoutMs) {
        throw new Error(`${queue}: stuck at ${current} of ${count} messages`);
      }
      await sleep(Math.min(50, Math.max(10, (at - started) / 1000)));
    }
  } finally {
    await channel.close().catch(() => undefined);
  }
}

/** A consumer that notes when each message arrived, by the id `idOf` reads from it. */
export interface ArrivalRecorder {
  readonly arrivals: Map<string, number>;
  /** Messages whose id was seen before (duplicates). */
  duplicates: number;
  close(): Promise<void>;
}

export async function recordArrivals(
  connection: amqp.ChannelModel,
  queue: string,
  idOf: (message: amqp.ConsumeMessage) => string | undefined,
): Promise<ArrivalRecorder> {
  const channel = await openChannel(connection);
  const recorder: ArrivalRecorder = {
    arrivals: new Map(),
    duplicates: 0,
    close: async () => {
      await channel.close().catch(() => undefined);
    },
  };
  await channel.consume(
    queue,
    (message) => {
      if (!message) return;
      const at = nowMs();
      const id = idOf(message);
      if (id === undefined) return;
      if (recorder.arrivals.has(id)) recorder.duplicates += 1;
      else recorder.arrivals.set(id, at);
    },
    { noAck: true },
  );
  return recorder;
}

/** Resolves once `recorder` has `count` distinct messages; rejects after a stall. */
export async function waitForArrivals(
  recorder: ArrivalRecorder,
  count: number,
  stallTimeoutMs = 30_000,
): Promise<void> {
  let last = -1;
  let lastChange = nowMs();
  while (recorder.arrivals.size < count) {
    if (recorder.arrivals.size !== last) {
      last = recorder.arrivals.size;
      lastChange = nowMs();
    } else if (nowMs() - lastChange > stallTimeoutMs) {
      throw new Error(`consumer stuck at ${last} of ${count} messages`);
    }
    await sleep(20);
  }
}

/**
 * Times `work` (the writers, or a relay starting) until `queue` holds `count` messages: seconds
 * from its start to the last message seen, the CPU per 1,000 messages meanwhile, and what `work`
 * resolved to.
 */
export async function timeUntilQueued<T>(
  connection: amqp.ChannelModel,
  queue: string,
  count: number,
  work: () => Promise<T>,
): Promise<{ seconds: number; cpu: CpuPerThousand; result: T }> {
  const cpuBefore = cpuNow();
  const started = nowMs();
  const filled = waitForCount(connection, queue, count);
  const result = await work();
  const seconds = ((await filled) - started) / 1000;
  return { seconds, cpu: cpuPerThousand(cpuBefore, cpuNow(), count), result };
}
