/**
 * The brokers bench:sequence runs on (`BENCH_TRANSPORT`): what the producer side does on each,
 * for the raw path (a) and the module path (b) alike. RabbitMQ is the default; NATS JetStream is
 * in sequence-nats.broker.ts.
 */
import type * as amqp from 'amqplib';
import type { Transport } from 'nest-sequence';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import type { ServerName } from './harness/cpu';
import { progress } from './harness/log';
import { connectAmqp, QueueJanitor } from './harness/resources';
import { publishRaw } from './sequence-rabbitmq.producer';
import type { BenchTransport } from './sequence-rabbitmq.protocol';

export interface BenchBroker {
  readonly transport: BenchTransport;
  /** The `bench` of the result lines: `sequence-rabbitmq`, `sequence-nats`. */
  readonly bench: string;
  /** The server process whose CPU the runs report. */
  readonly server: ServerName;
  /** Declares the raw path's queue (or stream and consumer), deleted at the end. */
  declareRaw(channel: string): Promise<void>;
  /**
   * Deletes the module path's channel (and its dead-letter channel) at the end, and its
   * `partitions` when it has some (broker-held).
   */
  trackModule(channel: string, partitions?: number): void;
  /** (a): the fragments as plain messages, at most `inFlight` awaiting their confirm at once. */
  publishRaw(channel: string, fragments: Iterable<Buffer>, inFlight: number): Promise<void>;
  /** Fails when anything is left on `channel` (and its `partitions`) once a run is over. */
  assertDrained(channel: string, what: string, partitions?: number): Promise<void>;
  /** The module path's producer transport. */
  connectTransport(unsafeSocketTricks: boolean): Promise<Transport>;
}

export class RabbitMqBenchBroker implements BenchBroker {
  readonly transport = 'rabbitmq';
  readonly bench = 'sequence-rabbitmq';
  readonly server = 'rabbitmq';

  private constructor(
    private readonly url: string,
    private readonly admin: amqp.Channel,
    private readonly raw: amqp.ConfirmChannel,
    private readonly queues: QueueJanitor,
  ) {}

  /** Connects (closed, and the run's queues deleted, when the benchmark ends). */
  static async connect(url: string, queuePrefix: string): Promise<RabbitMqBenchBroker> {
    const connection = await connectAmqp(url);
    const queues = new QueueJanitor(url, `${queuePrefix}.*`);
    const admin = await connection.createChannel();
    const raw = await connection.createConfirmChannel();
    for (const channel of [admin, raw]) {
      // A channel the broker closes fails its pending calls; without a listener it would throw.
      channel.on('error', (error: Error) => progress(`amqplib channel: ${error.message}`));
    }
    return new RabbitMqBenchBroker(url, admin, raw, queues);
  }

  async declareRaw(queue: string): Promise<void> {
    this.queues.track(queue);
    await this.admin.assertQueue(queue, { durable: true });
  }

  trackModule(queue: string, partitions = 0): void {
    this.queues.track(queue, `${queue}.dlq`, ...partitionQueues(queue, partitions));
    if (partitions > 0) this.queues.trackExchanges(`${queue}.partitions`);
  }

  publishRaw(queue: string, fragments: Iterable<Buffer>, inFlight: number): Promise<void> {
    return publishRaw(this.raw, queue, fragments, inFlight);
  }

  async assertDrained(queue: string, what: string, partitions = 0): Promise<void> {
    for (const each of [queue, ...partitionQueues(queue, partitions)]) {
      const { messageCount } = await this.admin.checkQueue(each);
      if (messageCount > 0) throw new Error(`${messageCount} message(s) left in ${each} (${what})`);
    }
  }

  connectTransport(unsafeSocketTricks: boolean): Promise<Transport> {
    return RabbitMqTransport.connect(this.url, { unsafeSocketTricks });
  }
}

/** The RabbitMQ transport's queues of a partitioned channel: `<queue>.partition.<i>`. */
function partitionQueues(queue: string, partitions: number): string[] {
  return Array.from({ length: partitions }, (_, index) => `${queue}.partition.${index}`);
}
