/**
 * The brokers the demo runs on, as its end-to-end tests see them: the demo's environment for
 * each, and what a test does on the broker behind the demo's back (take a message off a channel,
 * publish as another program would, count what is left, remove the channels). A spec written
 * against {@link DemoBroker} runs on RabbitMQ and on NATS JetStream alike.
 */
import * as amqplib from 'amqplib';
import type { Transport } from 'nest-sequence';
import { NatsTransport } from 'nest-sequence/nats';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { jetstream, jetstreamManager, type JetStreamManager } from '@nats-io/jetstream';
import {
  connectNats,
  natsHeaders,
  type NatsConnection,
} from '../../libs/sequence/src/adapters/transports/nats/nats.client';
import { streamName } from '../../libs/sequence/src/adapters/transports/nats/nats.naming';
import { amqpConnection } from '../../libs/sequence/test/support/rabbitmq.fixture';
import { SERVERS, type ServerName } from '../../libs/sequence/test/support/servers';

/** A message taken off a channel: its body, and its headers as the broker carries them. */
export interface TakenMessage {
  readonly body: Buffer;
  readonly headers: Readonly<Record<string, unknown>>;
}

export interface DemoBroker {
  /** The server the block needs (for describeWithServer). */
  readonly server: ServerName;
  /** How the block is named: `on RabbitMQ`, `on NATS JetStream`. */
  readonly label: string;
  /** The demo's environment for this broker: its URL set, the other broker's unset. */
  readonly env: Readonly<Record<string, string | undefined>>;
  /** The transport's name, as the demos print it. */
  readonly transportName: string;
  open(): Promise<void>;
  close(): Promise<void>;
  /**
   * Removes `channels` with whatever the transport declared for them (dead-letter queues or
   * streams); fine when they do not exist.
   */
  deleteChannels(channels: readonly string[]): Promise<void>;
  /** The first message to arrive on `channel`, taken off it; fails after `timeoutMs`. */
  nextMessage(channel: string, timeoutMs: number): Promise<TakenMessage>;
  /** Publishes as a program that knows only the wire contract (string-valued on NATS). */
  publishForeign(
    channel: string,
    body: Buffer,
    headers: Readonly<Record<string, string | number | boolean>>,
  ): Promise<void>;
  /** Messages on `channel` not yet consumed (unacked ones included on NATS). */
  pending(channel: string): Promise<number>;
  /** The library's transport on this broker, for a test that sends as another instance would. */
  connectTransport(): Promise<Transport>;
}

const POLL_MS = 50;

/** RabbitMQ through plain amqplib. Every queue the transport declares has a `.dlq` of its own. */
export class RabbitMqDemoBroker implements DemoBroker {
  readonly server = 'rabbitmq';
  readonly label = 'on RabbitMQ';
  readonly env = { AMQP_URL: SERVERS.rabbitmq.url, NATS_URL: undefined };
  readonly transportName = 'rabbitmq';
  private connection!: amqplib.ChannelModel;
  private channel!: amqplib.Channel;

  async open(): Promise<void> {
    this.connection = await amqpConnection();
    // Fail the test that uses a broken connection, rather than crash the worker.
    this.connection.on('error', () => undefined);
    this.channel = await this.connection.createChannel();
    this.channel.on('error', () => undefined);
  }

  async close(): Promise<void> {
    await this.connection.close();
  }

  async deleteChannels(channels: readonly string[]): Promise<void> {
    const admin = await this.connection.createChannel(); // of its own: a test may break another
    for (const queue of channels.flatMap((each) => [each, `${each}.dlq`, `${each}.dlq.dlq`])) {
      await admin.deleteQueue(queue);
    }
    await admin.close();
  }

  /**
   * The queue may not exist yet (the transport declares it on first publish): the broker then
   * closes the channel, and the next attempt opens another.
   */
  async nextMessage(queue: string, timeoutMs: number): Promise<TakenMessage> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const channel = await this.connection.createChannel();
      channel.on('error', () => undefined);
      try {
        const message = await channel.get(queue, { noAck: true });
        if (message) {
          return { body: message.content, headers: message.properties.headers ?? {} };
        }
      } catch (error) {
        // amqplib rejects with the broker's channel.close frame
        if ((error as { fields?: { replyCode?: number } }).fields?.replyCode !== 404) throw error;
      } finally {
        await channel.close().catch(() => undefined);
      }
      if (Date.now() > deadline) throw new Error(`nothing arrived on ${queue} in ${timeoutMs} ms`);
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    }
  }

  async publishForeign(
    queue: string,
    body: Buffer,
    headers: Readonly<Record<string, string | number | boolean>>,
  ): Promise<void> {
    this.channel.sendToQueue(queue, body, { headers });
    await Promise.resolve();
  }

  async pending(queue: string): Promise<number> {
    return (await this.channel.checkQueue(queue)).messageCount;
  }

  connectTransport(): Promise<Transport> {
    return RabbitMqTransport.connect(SERVERS.rabbitmq.url);
  }
}

/**
 * NATS JetStream through the official client. A channel is the stream `NSEQ_<channel escaped>`
 * with the durable pull consumer `nest-sequence` (the transport's defaults); a channel's
 * `.dlq` has a stream of its own, and a dead-letter channel none.
 */
export class NatsDemoBroker implements DemoBroker {
  readonly server = 'nats';
  readonly label = 'on NATS JetStream';
  readonly env = { NATS_URL: SERVERS.nats.url, AMQP_URL: undefined };
  readonly transportName = 'nats';
  private connection!: NatsConnection;
  private jsm!: JetStreamManager;

  async open(): Promise<void> {
    this.connection = await connectNats({ servers: SERVERS.nats.url });
    this.jsm = await jetstreamManager(this.connection);
  }

  async close(): Promise<void> {
    await this.connection.close();
  }

  async deleteChannels(channels: readonly string[]): Promise<void> {
    for (const channel of channels.flatMap((each) => [each, `${each}.dlq`])) {
      await this.jsm.streams.delete(stream(channel)).catch((error: Error) => {
        if (!/stream not found/i.test(error.message)) throw error;
      });
    }
  }

  async nextMessage(channel: string, timeoutMs: number): Promise<TakenMessage> {
    const deadline = Date.now() + timeoutMs;
    const js = jetstream(this.connection);
    for (;;) {
      // The stream and its consumer appear when the transport first publishes or subscribes.
      const consumer = await js.consumers.get(stream(channel), 'nest-sequence').catch(() => null);
      const message = await consumer
        ?.next({ expires: Math.max(1_000, Math.min(5_000, deadline - Date.now())) })
        .catch(() => null);
      if (message) {
        await message.ackAck();
        const headers: Record<string, string> = {};
        for (const [name, values] of message.headers ?? []) headers[name] = values[0];
        return { body: Buffer.from(message.data), headers };
      }
      if (Date.now() > deadline) {
        throw new Error(`nothing arrived on ${channel} in ${timeoutMs} ms`);
      }
      if (!consumer) await new Promise((resolve) => setTimeout(resolve, POLL_MS));
    }
  }

  async publishForeign(
    channel: string,
    body: Buffer,
    headers: Readonly<Record<string, string | number | boolean>>,
  ): Promise<void> {
    const wire = natsHeaders();
    for (const [name, value] of Object.entries(headers)) wire.append(name, String(value));
    await jetstream(this.connection).publish(channel, body, { headers: wire as never });
  }

  async pending(channel: string): Promise<number> {
    return (await this.jsm.streams.info(stream(channel))).state.messages;
  }

  connectTransport(): Promise<Transport> {
    return NatsTransport.connect({ servers: SERVERS.nats.url });
  }
}

function stream(channel: string): string {
  return streamName('NSEQ_', channel);
}

/** Both brokers, for `describe`-per-broker specs. */
export const DEMO_BROKERS: readonly DemoBroker[] = [new RabbitMqDemoBroker(), new NatsDemoBroker()];
