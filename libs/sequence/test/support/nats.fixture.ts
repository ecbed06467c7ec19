/**
 * The tests' NATS: the JetStream server at `NATS_URL` (see ./servers.ts). Wrap the block in
 * `describeWithServer('nats', …)`; a {@link NatsAdmin} hands out a channel per test and deletes
 * its streams after the test.
 */
import { randomUUID } from 'node:crypto';
import {
  JetStreamApiError,
  jetstream,
  jetstreamManager,
  type JetStreamManager,
} from '@nats-io/jetstream';
import { NatsTransport, type NatsTransportOptions } from 'nest-sequence/nats';
import { connectNats, type NatsConnection } from '../../src/adapters/transports/nats/nats.client';
import { decodeHeaders } from '../../src/adapters/transports/nats/nats.headers';
import {
  leaseStreamName,
  partitionStreamName,
  streamName,
} from '../../src/adapters/transports/nats/nats.naming';
import { NATS_TRANSPORT_DEFAULTS } from '../../src/adapters/transports/nats/nats.options';
import type { BrokerAdmin, QueuedMessage } from './broker-admin';
import { SERVERS } from './servers';

export const NATS_URL = SERVERS.nats.url;

const { streamPrefix, durableName, deadLetterSuffix } = NATS_TRANSPORT_DEFAULTS;

/** How long a drain waits for the messages the consumer said it has. */
const DRAIN_WAIT_MS = 2_000;

/**
 * A NatsTransport on the test server under the client name `name`, reconnecting after
 * `reconnectMs`. The caller closes it.
 */
export function namedNatsTransport(
  name: string,
  options: { transport?: NatsTransportOptions; reconnectMs?: number } = {},
): Promise<NatsTransport> {
  return NatsTransport.connect(
    { servers: NATS_URL, name, reconnectTimeWait: options.reconnectMs ?? 200 },
    options.transport,
  );
}

/**
 * The server as an operator sees it, through a plain NATS connection of its own: what each
 * channel's durable consumer has not delivered yet, dead letters, and the streams of the channels
 * each test made (deleted by `cleanup`). The counterpart of `RabbitMqAdmin`, channel for queue.
 */
export class NatsAdmin implements BrokerAdmin {
  private readonly channels = new Set<string>();
  private readonly streams = new Set<string>();

  private constructor(
    private readonly connection: NatsConnection,
    private readonly jsm: JetStreamManager,
  ) {}

  /** Connects to the test server, or to the one at `url` (a server the test owns). */
  static async connect(url: string = NATS_URL): Promise<NatsAdmin> {
    const connection = await connectNats({ servers: url, name: 'nseq-test-admin' });
    return new NatsAdmin(connection, await jetstreamManager(connection));
  }

  /** A channel name of the test's own, `fault.<uuid>`, registered with its dead-letter channel. */
  newChannel(): string {
    const channel = `fault.${randomUUID()}`;
    this.channels.add(channel).add(`${channel}${deadLetterSuffix}`);
    return channel;
  }

  /** Messages of `channel` its consumer has not delivered yet (not those delivered and unacked). */
  async readyCount(channel: string): Promise<number> {
    return (await this.consumerInfo(channel)).num_pending;
  }

  /**
   * Pull requests waiting on `channel`'s consumer: each subscriber that has free prefetch slots
   * keeps one open, so this is at least the number of idle subscribers.
   */
  async consumerCount(channel: string): Promise<number> {
    return (await this.consumerInfo(channel)).num_waiting;
  }

  /**
   * Takes every message `channel`'s consumer has not delivered yet (acknowledged: they are gone
   * afterwards), headers decoded as the transport decodes them. A channel without a stream yet
   * reads as empty.
   */
  async drain(channel: string): Promise<QueuedMessage[]> {
    let pending: number;
    try {
      pending = await this.readyCount(channel);
    } catch (error) {
      if (error instanceof JetStreamApiError) return [];
      throw error;
    }
    if (pending === 0) return [];
    const consumer = await jetstream(this.connection).consumers.get(
      streamName(streamPrefix, channel),
      durableName,
    );
    const messages: QueuedMessage[] = [];
    const batch = await consumer.fetch({ max_messages: pending, expires: DRAIN_WAIT_MS });
    for await (const message of batch) {
      messages.push({
        body: Buffer.from(message.data),
        headers: decodeHeaders((message.headers ?? []) as Iterable<[string, string[]]>),
      });
      await message.ackAck();
    }
    return messages;
  }

  /** Deletes the streams of every channel handed out by `newChannel` (and forgets them). */
  partitioned(channel: string): void {
    this.streams.add(partitionStreamName(streamPrefix, channel));
    this.streams.add(leaseStreamName(streamPrefix, channel));
  }

  async cleanup(): Promise<void> {
    for (const channel of this.channels) {
      await this.jsm.streams.delete(streamName(streamPrefix, channel)).catch(() => undefined);
    }
    for (const stream of this.streams) {
      await this.jsm.streams.delete(stream).catch(() => undefined);
    }
    this.channels.clear();
    this.streams.clear();
  }

  async close(): Promise<void> {
    await this.cleanup();
    await this.connection.close();
  }

  private consumerInfo(channel: string) {
    return this.jsm.consumers.info(streamName(streamPrefix, channel), durableName);
  }
}
