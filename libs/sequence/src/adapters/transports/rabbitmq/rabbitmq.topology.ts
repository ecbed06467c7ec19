import type { Channel, Options } from 'amqplib';
import type { BrokerConnection, ConnectionManager } from './amqp.types';
import { RabbitMqTopologyError } from './errors/rabbitmq-topology.error';
import type { RabbitMqQueueType } from './rabbitmq.options';

/** AMQP reply codes by which the broker refuses a declaration (a soft error, not a lost link). */
const REFUSAL_CODES: ReadonlySet<number> = new Set([403, 404, 405, 406]);

/** Reply queues are `nseq.reply.<uuid>`: queue names of this prefix are theirs alone. */
/** `x-delivery-limit` of a quorum dead-letter queue: in effect none (2^31 - 1). */
export const UNLIMITED_DELIVERIES = 2_147_483_647;

export const REPLY_QUEUE_PREFIX = 'nseq.reply.';

/**
 * A reply queue: exclusive to the connection that consumes it (the broker deletes it with that
 * connection, however the process ends) and auto-deleted when its consumer is cancelled. Not
 * durable, no dead-letter queue; always classic (an exclusive queue cannot be a quorum queue).
 */
const REPLY_QUEUE_OPTIONS: Options.AssertQueue = {
  durable: false,
  exclusive: true,
  autoDelete: true,
  arguments: { 'x-queue-type': 'classic' },
};

/**
 * The queues behind a channel: a durable queue `<channel>` and its dead-letter queue
 * `<channel><suffix>`, both of the configured type. Every queue is declared the same way, with
 * the default exchange as its dead-letter exchange and its own dead-letter queue as routing key,
 * so the broker's own dead-lettering (reject without requeue, expiry, delivery limit) lands in
 * `<channel><suffix>`. A dead-letter queue (a name ending in the suffix) is the end of the line:
 * declared without a dead-letter exchange, and it gets no dead-letter queue of its own, so
 * dead-lettering never creates `x.dlq.dlq`; subscribing to it declares it the same way.
 *
 * Reply queues (`nseq.reply.<uuid>`) are declared only by their consumer, on its own connection
 * (see `REPLY_QUEUE_OPTIONS`); a publisher never declares one, so a publish to a reply queue that
 * is gone is returned as unroutable rather than recreating it.
 */
export class RabbitMqTopology {
  /** Channels declared on the current connection, or being declared. */
  private readonly declared = new Map<string, Promise<void>>();
  /** The channels of `declared` whose declaration has succeeded (checked without a promise). */
  private readonly ready = new Set<string>();
  private readonly connectionWaiters = new Set<(error?: Error) => void>();
  private disposed = false;

  constructor(
    private readonly queueType: RabbitMqQueueType,
    private readonly deadLetterSuffix: string,
    private readonly manager: () => ConnectionManager,
  ) {}

  deadLetterQueue(channel: string): string {
    return `${channel}${this.deadLetterSuffix}`;
  }

  /** True for a dead-letter queue: the end of the line, with no dead-letter queue of its own. */
  isDeadLetterQueue(queue: string): boolean {
    return this.deadLetterSuffix.length > 0 && queue.endsWith(this.deadLetterSuffix);
  }

  /** True for a reply queue: declared by its consumer alone. */
  isReplyQueue(queue: string): boolean {
    return queue.startsWith(REPLY_QUEUE_PREFIX);
  }

  /** Declares `channel`'s queue and (unless it is one) its dead-letter queue on an open channel. */
  async declareOn(amqp: Channel, channel: string): Promise<void> {
    if (this.isReplyQueue(channel)) {
      await amqp.assertQueue(channel, REPLY_QUEUE_OPTIONS);
      return;
    }
    const queues = this.isDeadLetterQueue(channel)
      ? [channel]
      : [channel, this.deadLetterQueue(channel)];
    for (const queue of queues) {
      try {
        await amqp.assertQueue(queue, this.queueOptions(queue));
      } catch (error) {
        const code = replyCode(error);
        if (code !== undefined && REFUSAL_CODES.has(code)) {
          throw new RabbitMqTopologyError(queue, code, error as Error);
        }
        throw error;
      }
    }
  }

  /**
   * Declares `channel`'s queues once per connection, on a short-lived channel of its own so that a
   * refused declaration cannot close a channel that publishes or consumes. Waits for a connection
   * when there is none; the caller bounds the wait.
   */
  ensure(channel: string): Promise<void> {
    if (this.isReplyQueue(channel)) return Promise.resolve();
    let pending = this.declared.get(channel);
    if (!pending) {
      pending = this.declareWhenConnected(channel);
      this.declared.set(channel, pending);
      const settled = pending;
      settled.then(
        () => {
          if (this.declared.get(channel) === settled) this.ready.add(channel);
        },
        () => {
          if (this.declared.get(channel) === settled) this.declared.delete(channel);
        },
      );
    }
    return pending;
  }

  /** True when `channel` is declared on the current connection: `ensure` would have nothing to do. */
  isReady(channel: string): boolean {
    return this.isReplyQueue(channel) || this.ready.has(channel);
  }

  /**
   * Forgets what was declared. Called on disconnect: the broker may have been reset while we were
   * away, and publishing to a queue that no longer exists would be confirmed and lost.
   */
  forget(): void {
    this.declared.clear();
    this.ready.clear();
  }

  /**
   * Forgets one channel's declaration: the broker returned a message published to it as
   * unroutable (its queue was deleted while we were connected). The next `ensure` declares it again.
   */
  forgetChannel(channel: string): void {
    this.declared.delete(channel);
    this.ready.delete(channel);
  }

  /** Stops waiting for connections; pending `ensure` calls reject. */
  dispose(): void {
    this.disposed = true;
    this.declared.clear();
    this.ready.clear();
    for (const wake of [...this.connectionWaiters]) wake(new Error('the transport is closed'));
  }

  private queueOptions(queue: string): Options.AssertQueue {
    if (this.isDeadLetterQueue(queue)) {
      // Browsing reads a dead-letter queue by taking and putting back, which a quorum queue counts
      // as deliveries; RabbitMQ 4.0–4.2 default a limit of 20 and drop past it. -1 ("no limit"
      // from 4.0) makes 3.x drop on the first put-back, so the largest limit the broker takes.
      const limit = this.queueType === 'quorum' ? { 'x-delivery-limit': UNLIMITED_DELIVERIES } : {};
      return { durable: true, arguments: { 'x-queue-type': this.queueType, ...limit } };
    }
    return {
      durable: true,
      arguments: {
        'x-queue-type': this.queueType,
        'x-dead-letter-exchange': '',
        'x-dead-letter-routing-key': this.deadLetterQueue(queue),
      },
    };
  }

  private async declareWhenConnected(channel: string): Promise<void> {
    for (;;) {
      const connection = await this.connection();
      try {
        const amqp = await connection.createChannel();
        // Without a listener, a channel closed by the broker throws; the failed call reports it.
        amqp.on('error', () => undefined);
        try {
          await this.declareOn(amqp, channel);
        } finally {
          await amqp.close().catch(() => undefined);
        }
        return;
      } catch (error) {
        // The connection dropped under us: declare again on the next one. Anything else is real.
        if (error instanceof RabbitMqTopologyError || this.manager().connection === connection) {
          throw error;
        }
      }
    }
  }

  /** The current connection, or the next one. */
  private connection(): Promise<BrokerConnection> {
    if (this.disposed) return Promise.reject(new Error('the transport is closed'));
    const manager = this.manager();
    const current = manager.connection;
    if (current) return Promise.resolve(current);
    return new Promise<BrokerConnection>((resolve, reject) => {
      const onConnect = (): void => wake();
      const wake = (error?: Error): void => {
        this.connectionWaiters.delete(wake);
        manager.removeListener('connect', onConnect);
        const connection = manager.connection;
        if (error) reject(error);
        else if (connection) resolve(connection);
        else resolve(this.connection());
      };
      this.connectionWaiters.add(wake);
      manager.on('connect', onConnect);
    });
  }
}

function replyCode(error: unknown): number | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'number' ? code : undefined;
}
