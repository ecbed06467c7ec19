/**
 * The tests' RabbitMQ: the broker at `AMQP_URL` (see ./servers.ts). Wrap the block in
 * `describeWithServer('rabbitmq', …)`; {@link useRabbitMq} gives it a {@link RabbitMqAdmin}, whose
 * `newChannel()` hands out a queue per test and deletes it after the test.
 */
import { randomUUID } from 'node:crypto';
import type { LoggerService } from '@nestjs/common';
import type { RabbitMQConfig } from '@golevelup/nestjs-rabbitmq';
import * as amqplib from 'amqplib';
import { RabbitMqTransport, type RabbitMqTransportOptions } from 'nest-sequence/rabbitmq';
import { SERVERS } from './servers';
import { closeConnectionsWhere, rabbitmqctl, rabbitmqctlRows } from './processes/rabbitmqctl';
import {
  useBrokerAdmin,
  type BrokerAdmin,
  type BrokerAdminOptions,
  type QueuedMessage,
} from './broker-admin';

export type { QueuedMessage } from './broker-admin';

export const AMQP_URL = SERVERS.rabbitmq.url;

export const silentLogger: LoggerService = {
  log: () => undefined,
  error: () => undefined,
  warn: () => undefined,
};

/** A plain amqplib connection of the caller's own to the test broker (the caller closes it). */
export function amqpConnection(): Promise<amqplib.ChannelModel> {
  return amqplib.connect(AMQP_URL);
}

/**
 * golevelup settings for a connection the broker lists under `name` (the AMQP client property
 * `connection_name`), quiet, reconnecting after `reconnectSeconds`.
 */
export function namedConnection(name: string, reconnectSeconds = 0.2): Omit<RabbitMQConfig, 'uri'> {
  return {
    logger: silentLogger,
    connectionInitOptions: { timeout: 5_000 },
    connectionManagerOptions: {
      reconnectTimeInSeconds: reconnectSeconds,
      connectionOptions: { clientProperties: { connection_name: name } },
    },
  };
}

/**
 * A RabbitMqTransport on the test broker whose connection the broker lists under `name` (so that
 * a test can have exactly this one dropped), reconnecting after `reconnectSeconds`. The caller
 * closes it.
 */
export function namedTransport(
  name: string,
  options: { transport?: RabbitMqTransportOptions; reconnectSeconds?: number } = {},
): Promise<RabbitMqTransport> {
  return RabbitMqTransport.connect(
    AMQP_URL,
    options.transport,
    namedConnection(name, options.reconnectSeconds),
  );
}

/**
 * The broker as an operator sees it, through a plain amqplib connection of its own: queue depths,
 * dead letters, and the queues each test created (deleted by `cleanup`, dead-letter queues too).
 */
export class RabbitMqAdmin implements BrokerAdmin {
  private readonly queues = new Set<string>();
  private readonly exchanges = new Set<string>();

  private constructor(private readonly connection: amqplib.ChannelModel) {}

  static async connect(): Promise<RabbitMqAdmin> {
    return new RabbitMqAdmin(await amqpConnection());
  }

  /** A channel name of the test's own, `fault.<uuid>`, registered with its `.dlq` for cleanup. */
  newChannel(): string {
    const channel = `fault.${randomUUID()}`;
    this.queues.add(channel).add(`${channel}.dlq`).add(`${channel}.dlq.dlq`);
    return channel;
  }

  partitioned(channel: string, count: number): void {
    for (let index = 0; index < count; index++) this.queues.add(`${channel}.partition.${index}`);
    this.exchanges.add(`${channel}.partitions`);
  }

  /** Ready messages of `queue` (not those delivered and unacknowledged). */
  async readyCount(queue: string): Promise<number> {
    return this.withChannel(async (channel) => (await channel.checkQueue(queue)).messageCount);
  }

  /** Consumers subscribed to `queue` right now. */
  async consumerCount(queue: string): Promise<number> {
    return this.withChannel(async (channel) => (await channel.checkQueue(queue)).consumerCount);
  }

  /**
   * Ready plus unacknowledged messages of `queue`, as `rabbitmqctl list_queues` reports them
   * (about a second per call: it starts an Erlang node).
   */
  async totalCount(queue: string): Promise<{ ready: number; unacked: number }> {
    const rows = await rabbitmqctlRows('list_queues', [
      'name',
      'messages_ready',
      'messages_unacknowledged',
    ]);
    const row = rows.find(([name]) => name === queue);
    if (!row) throw new Error(`rabbitmqctl does not list queue ${queue}`);
    return { ready: Number(row[1]), unacked: Number(row[2]) };
  }

  /**
   * Takes every ready message off `queue` (acknowledged: they are gone afterwards), in the queue's
   * order. Through a consumer without acks rather than one `basic.get` round trip per message
   * (seconds for thousands): it takes as many as the queue held when asked, or stops once the
   * queue reads empty with nothing more arriving (another consumer took some), and answers every
   * message it was handed before its cancel, later ones too.
   */
  async drain(queue: string): Promise<QueuedMessage[]> {
    return this.withChannel(async (channel) => {
      const { messageCount } = await channel.checkQueue(queue);
      const messages: QueuedMessage[] = [];
      if (messageCount === 0) return messages;
      let cancelled = false;
      const { consumerTag } = await channel.consume(
        queue,
        (message) => {
          if (message === null) {
            cancelled = true; // by the broker: the queue was deleted
            return;
          }
          messages.push({
            body: message.content,
            headers: { ...(message.properties.headers ?? {}) },
          });
        },
        { noAck: true },
      );
      let seen = -1;
      while (messages.length < messageCount && !cancelled) {
        await new Promise((resolve) => setTimeout(resolve, 20));
        if (messages.length !== seen) {
          seen = messages.length;
          continue;
        }
        if ((await channel.checkQueue(queue)).messageCount === 0) break;
      }
      if (!cancelled) await channel.cancel(consumerTag);
      return messages;
    });
  }

  /** A confirm channel for publishing raw messages; the caller closes it. */
  async confirmChannel(): Promise<amqplib.ConfirmChannel> {
    const channel = await this.connection.createConfirmChannel();
    channel.on('error', () => undefined);
    return channel;
  }

  /**
   * Has the broker close the one connection named `name` (as an operator or a failover would),
   * leaving every other connection alone. Resolves once rabbitmqctl has closed it.
   */
  async closeConnection(name: string): Promise<void> {
    const closed = await closeConnectionsWhere({ connectionName: name }, 'closed by a fault test');
    if (closed !== 1) throw new Error(`expected one connection named ${name}, closed ${closed}`);
  }

  /**
   * Has the broker close the connection whose pid {@link connectionPid} answered, for a test that
   * needs the pid anyway (to tell the next connection from it).
   */
  async closeConnectionPid(pid: string): Promise<void> {
    await rabbitmqctl(['close_connection', pid, 'closed by a fault test']);
  }

  /** The broker's pid of the connection named `name`; fails when there is not exactly one. */
  async connectionPid(name: string): Promise<string> {
    // Not --formatter json: its pids (`#PID<…>`) are not the form close_connection parses.
    const rows = await rabbitmqctlRows('list_connections', ['pid', 'client_properties']);
    const property = `{"connection_name",${JSON.stringify(name)}}`;
    const pids = rows
      .filter(([, properties]) => properties?.includes(property))
      .map(([pid]) => pid);
    if (pids.length !== 1) {
      throw new Error(`expected one connection named ${name}, found ${pids.length}`);
    }
    return pids[0];
  }

  /** Deletes every queue handed out by `newChannel` (and forgets them); safe to call twice. */
  async cleanup(): Promise<void> {
    await this.withChannel(async (channel) => {
      for (const queue of this.queues) await channel.deleteQueue(queue);
      for (const exchange of this.exchanges) await channel.deleteExchange(exchange);
    });
    this.queues.clear();
    this.exchanges.clear();
  }

  async close(): Promise<void> {
    await this.cleanup();
    await this.connection.close();
  }

  /** Runs `work` on a fresh channel: a failed call (404) closes only that channel. */
  private async withChannel<T>(work: (channel: amqplib.Channel) => Promise<T>): Promise<T> {
    const channel = await this.connection.createChannel();
    channel.on('error', () => undefined);
    try {
      return await work(channel);
    } finally {
      await channel.close().catch(() => undefined);
    }
  }
}

/**
 * Registers, in the calling describe block, a {@link RabbitMqAdmin} connected for its tests, the
 * deletion after each test of the queues it handed out, and its close after them. Call it before
 * the block's own hooks.
 */
export function useRabbitMq(options: BrokerAdminOptions = {}): { readonly admin: RabbitMqAdmin } {
  return useBrokerAdmin(() => RabbitMqAdmin.connect(), options);
}
