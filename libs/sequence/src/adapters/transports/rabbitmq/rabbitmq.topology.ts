import type { Channel, Options } from 'amqplib';
import { PartitionCountMismatchError } from '../../../core/errors/partition-count-mismatch.error';
import type { BrokerConnection, ConnectionManager } from './amqp.types';
import { RabbitMqTopologyError } from './errors/rabbitmq-topology.error';
import type { RabbitMqQueueType } from './rabbitmq.options';

/** AMQP reply codes by which the broker refuses a declaration (a soft error, not a lost link). */
const REFUSAL_CODES: ReadonlySet<number> = new Set([403, 404, 405, 406]);
/** AMQP reply code of a declaration whose arguments differ from the existing one's. */
const PRECONDITION_FAILED = 406;
/** A partition count marker's `alternate-exchange` is this prefix and the count. */
const PARTITION_COUNT_PREFIX = 'nseq.partitions.';

/** `x-delivery-limit` of a quorum dead-letter queue: in effect none (2^31 - 1). */
export const UNLIMITED_DELIVERIES = 2_147_483_647;

/** Reply queues are `nseq.reply.<uuid>`: queue names of this prefix are theirs alone. */
export const REPLY_QUEUE_PREFIX = 'nseq.reply.';
const REPLY_QUEUE = /^nseq\.reply\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
/** Longest queue name AMQP carries (a short string), in bytes. */
export const MAX_QUEUE_NAME_BYTES = 255;

/** Whether `queue` is a reply queue's name: `nseq.reply.<uuid>`, exactly. */
export function isReplyQueueName(queue: string): boolean {
  return REPLY_QUEUE.test(queue);
}

/**
 * Why the transport cannot publish to `queue` at all, or undefined: a name AMQP cannot carry
 * (amqplib would fail to encode the publish), or one of the reply prefix that is no reply queue.
 */
export function queueNameProblem(queue: string): string | undefined {
  const bytes = Buffer.byteLength(queue);
  if (bytes > MAX_QUEUE_NAME_BYTES) {
    return `its name is ${bytes} bytes; AMQP carries at most ${MAX_QUEUE_NAME_BYTES}`;
  }
  if (queue.startsWith(REPLY_QUEUE_PREFIX) && !isReplyQueueName(queue)) {
    return `names under ${REPLY_QUEUE_PREFIX} are reply queues, ${REPLY_QUEUE_PREFIX}<uuid>`;
  }
  return undefined;
}

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
 * the broker's dead-lettering never creates `x.dlq.dlq`; subscribing to it declares it the same
 * way. (A subscriber's own dead-letter verdict on `x.dlq` is forwarded to `x.dlq.dlq`, declared
 * then, as for any channel.)
 *
 * Reply queues (`nseq.reply.<uuid>`) are declared only by their consumer, on its own connection
 * (see `REPLY_QUEUE_OPTIONS`); a publisher never declares one, so a publish to a reply queue that
 * is gone is returned as unroutable rather than recreating it.
 *
 * A channel split into `count` partitions (see `ensurePartitions`) also has:
 * - `count` partition queues `<channel>.partition.<i>` (i from 0), declared like the channel's
 *   queue (same type) plus `x-single-active-consumer: true`, and dead-lettering into the
 *   channel's dead-letter queue `<channel><suffix>`, which is declared with them;
 * - a marker exchange `<channel>.partitions` (fanout, durable, never published to) whose
 *   `alternate-exchange` argument names the count, `nseq.partitions.<count>` (an exchange that
 *   need not exist: nothing is published to the marker). RabbitMQ does
 *   not compare unknown queue arguments when a queue is declared again, but it does compare an
 *   exchange's `alternate-exchange`: a declaration with another count is refused (406), which is
 *   how producers and consumers that disagree on the count find out, whichever came first.
 */
export class RabbitMqTopology {
  /** Channels (and partition sets) declared on the current connection, or being declared. */
  private readonly declared = new Map<string, Promise<void>>();
  /** The keys of `declared` whose declaration has succeeded (checked without a promise). */
  private readonly ready = new Set<string>();
  /** Each partition queue declared so far (on any connection), with the set it belongs to. */
  private readonly partitionQueues = new Map<string, { channel: string; count: number }>();
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
    return isReplyQueueName(queue);
  }

  /** The queue of partition `index` of `channel`: `<channel>.partition.<index>`. */
  partitionQueue(channel: string, index: number): string {
    return `${channel}.partition.${index}`;
  }

  /** The exchange whose `alternate-exchange` records `channel`'s partition count. */
  partitionMarker(channel: string): string {
    return `${channel}.partitions`;
  }

  /**
   * Declares `channel`'s partition queues, its dead-letter queue and its marker, once per
   * connection and count, on a short-lived channel (a refused marker closes it). Rejects with
   * `PartitionCountMismatchError` when the channel was declared with another count. Once it has
   * resolved, `ensure` and `isReady` know each partition queue.
   */
  ensurePartitions(channel: string, count: number): Promise<void> {
    const key = partitionSetKey(channel, count);
    const queues = Array.from({ length: count }, (_, index) => this.partitionQueue(channel, index));
    return this.ensureKey(
      key,
      (amqp) => this.declarePartitionsOn(amqp, channel, count, queues),
      () => {
        for (const queue of queues) {
          this.partitionQueues.set(queue, { channel, count });
          this.ready.add(queue);
        }
      },
    );
  }

  /** True when `ensurePartitions(channel, count)` would have nothing to do. */
  partitionsReady(channel: string, count: number): boolean {
    return this.ready.has(partitionSetKey(channel, count));
  }

  private async declarePartitionsOn(
    amqp: Channel,
    channel: string,
    count: number,
    queues: readonly string[],
  ): Promise<void> {
    const marker = this.partitionMarker(channel);
    try {
      await amqp.assertExchange(marker, 'fanout', {
        durable: true,
        autoDelete: false,
        arguments: { 'alternate-exchange': `${PARTITION_COUNT_PREFIX}${count}` },
      });
    } catch (error) {
      if (replyCode(error) === PRECONDITION_FAILED) {
        throw new PartitionCountMismatchError(channel, count, declaredCount(error));
      }
      throw error;
    }
    const deadLetterQueue = this.deadLetterQueue(channel);
    await this.assertQueue(amqp, deadLetterQueue, this.queueOptions(deadLetterQueue));
    for (const queue of queues) {
      const options = this.queueOptions(queue, deadLetterQueue, {
        'x-single-active-consumer': true,
      });
      await this.assertQueue(amqp, queue, options);
    }
  }

  private async assertQueue(amqp: Channel, queue: string, options: Options.AssertQueue) {
    try {
      await amqp.assertQueue(queue, options);
    } catch (error) {
      const code = replyCode(error);
      if (code !== undefined && REFUSAL_CODES.has(code)) {
        throw new RabbitMqTopologyError(queue, code, error as Error);
      }
      throw error;
    }
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
    for (const queue of queues) await this.assertQueue(amqp, queue, this.queueOptions(queue));
  }

  /**
   * Declares `channel`'s queues once per connection, on a short-lived channel of its own so that a
   * refused declaration cannot close a channel that publishes or consumes. Waits for a connection
   * when there is none; the caller bounds the wait.
   */
  ensure(channel: string): Promise<void> {
    if (this.isReplyQueue(channel)) return Promise.resolve();
    // A partition queue is declared with its set (after a reconnect, say, for a delayed requeue).
    const partitions = this.partitionQueues.get(channel);
    if (partitions) return this.ensurePartitions(partitions.channel, partitions.count);
    return this.ensureKey(channel, (amqp) => this.declareOn(amqp, channel));
  }

  /** Runs `declare` once per connection for `key`; `onReady` when it has succeeded. */
  private ensureKey(
    key: string,
    declare: (amqp: Channel) => Promise<void>,
    onReady?: () => void,
  ): Promise<void> {
    let pending = this.declared.get(key);
    if (!pending) {
      pending = this.declareWhenConnected(declare);
      this.declared.set(key, pending);
      const settled = pending;
      settled.then(
        () => {
          if (this.declared.get(key) !== settled) return;
          this.ready.add(key);
          onReady?.();
        },
        () => {
          if (this.declared.get(key) === settled) this.declared.delete(key);
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
    const partitions = this.partitionQueues.get(channel);
    if (partitions) {
      const key = partitionSetKey(partitions.channel, partitions.count);
      this.declared.delete(key);
      this.ready.delete(key);
      for (let index = 0; index < partitions.count; index++) {
        this.ready.delete(this.partitionQueue(partitions.channel, index));
      }
      return;
    }
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

  /**
   * `deadLetterQueue`: where it dead-letters, when not its own `<queue><suffix>`; `extra`: more
   * arguments of a queue that is not a dead-letter queue.
   */
  private queueOptions(
    queue: string,
    deadLetterQueue?: string,
    extra: Readonly<Record<string, unknown>> = {},
  ): Options.AssertQueue {
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
        'x-dead-letter-routing-key': deadLetterQueue ?? this.deadLetterQueue(queue),
        ...extra,
      },
    };
  }

  private async declareWhenConnected(declare: (amqp: Channel) => Promise<void>): Promise<void> {
    for (;;) {
      const connection = await this.connection();
      try {
        const amqp = await connection.createChannel();
        // Without a listener, a channel closed by the broker throws; the failed call reports it.
        amqp.on('error', () => undefined);
        try {
          await declare(amqp);
        } finally {
          await amqp.close().catch(() => undefined);
        }
        return;
      } catch (error) {
        // The connection dropped under us: declare again on the next one. Anything else is real.
        if (
          error instanceof RabbitMqTopologyError ||
          error instanceof PartitionCountMismatchError ||
          this.manager().connection === connection
        ) {
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

/** The key of a channel's partition set in `declared` and `ready`: never a queue's name. */
function partitionSetKey(channel: string, count: number): string {
  return `\0partitions\0${count}\0${channel}`;
}

/**
 * The count a marker was declared with, from the broker's refusal ("inequivalent arg
 * 'alternate-exchange' ... received 'nseq.partitions.2' but current is 'nseq.partitions.4'");
 * undefined when the message does not tell (the broker cuts its reply text at 255 bytes, which a
 * channel name of some 90 characters or more reaches).
 */
function declaredCount(error: unknown): number | undefined {
  const message = (error as Error | undefined)?.message ?? '';
  const count = /but current is '(?:[^']*\.)?(\d+)'/.exec(message)?.[1];
  if (count === undefined || !message.includes(`current is '${PARTITION_COUNT_PREFIX}`)) {
    return undefined;
  }
  const declared = Number(count);
  return Number.isSafeInteger(declared) && declared > 0 ? declared : undefined;
}

function replyCode(error: unknown): number | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'number' ? code : undefined;
}
