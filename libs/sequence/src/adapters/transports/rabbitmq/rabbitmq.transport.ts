import { randomUUID } from 'node:crypto';
import { Logger } from '@nestjs/common';
import type { AmqpConnection, RabbitMQConfig } from '@golevelup/nestjs-rabbitmq';
import type { ConfirmChannel } from 'amqplib';
import { delay, withTimeout } from '../../../core/async';
import { leaseClock, msSince } from '../../../core/lease-clock';
import { BrokerUnavailableError } from '../../../core/errors/broker-unavailable.error';
import { PublishRejectedError } from '../../../core/errors/publish-rejected.error';
import { PublishTimeoutError } from '../../../core/errors/publish-timeout.error';
import { errorMessage } from '../../../core/errors/caught';
import { partitionsProblem } from '../../../core/partition';
import type { HeaderMap } from '../../../core/headers';
import {
  assertSendable,
  DEFAULT_REPLY_PREFETCH,
  publishTimeoutMs,
  partitionAddressProblem,
  prefetchProblem,
  type MessageHandler,
  type PartitionAddress,
  type PublishOptions,
  type ReplyChannelOptions,
  type SubscribeOptions,
  type Subscription,
  type Transport,
} from '../../../ports/transport.port';
import { assembleContentInPlace } from './amqp-content-reads';
import { coalesceFrameWrites } from './amqp-frame-writes';
import type { ConnectionManager, ManagedChannel } from './amqp.types';
import {
  resolveRabbitMqTransportOptions,
  type RabbitMqTransportOptions,
  type ResolvedRabbitMqTransportOptions,
} from './rabbitmq.options';
import type { DeadLetterBox } from '../../../ports/dead-letter-box.port';
import { RabbitMqDeadLetterBox } from './rabbitmq.dead-letter-box';
import { RabbitMqSubscription } from './rabbitmq.subscription';
import {
  isReplyQueueName,
  queueNameProblem,
  REPLY_QUEUE_PREFIX,
  RabbitMqTopology,
} from './rabbitmq.topology';
import { RabbitMqTopologyError } from './errors/rabbitmq-topology.error';
import { assertEncodableHeaders } from '../../../ports/transport-headers';
import { socketTricksEnabled } from '../../socket-tricks.guard';

/** What a call that needs the connection says while it is being made again. */
const NOT_CONNECTED = 'not connected to RabbitMQ (reconnecting)';

/** What amqp-connection-manager and amqplib reject a publish with (their messages are the API). */
const CONFIRM_TIMEOUT = 'timeout';
const NEGATIVE_CONFIRM = 'message nacked';

/**
 * {@link Transport} over RabbitMQ, through golevelup's `AmqpConnection`.
 *
 * - Each channel is a durable queue (`classic` or `quorum`) with a dead-letter queue
 *   `<channel><deadLetterSuffix>` ({@link RabbitMqTransport.deadLetterChannel}, `<channel>.dlq` by
 *   default); the broker's own dead-lettering goes there too. Queues are declared before
 *   the first publish or subscribe, so messages published before anyone subscribes are kept.
 * - `publish` sends a persistent message through the default exchange on a confirm channel of the
 *   transport's own, and resolves on the broker's confirm. Bodies are raw bytes; header values keep
 *   their AMQP types (strings, integers of any size up to 2^53, booleans).
 * - Each subscription consumes on a channel of its own with `basic.qos` = `prefetch` and manual
 *   acknowledgement; it resumes by itself after the connection is lost and re-established, and
 *   after the broker closes its channel alone (e.g. on `consumer_timeout`).
 * - A `requeue` without delay (or a handler that throws) is a `basic.nack` with requeue: the
 *   message goes back to its place near the head. A `requeue` with `delayMs` holds the delivery
 *   (and its prefetch slot) for the delay, then puts a copy at the tail of the queue, with
 *   `x-requeue-count` incremented, and acks the original.
 * - Partitioned channels ({@link Transport.partitioned}): partition `i` of channel `c` is a durable
 *   queue `c.partition.<i>` of the same type with `x-single-active-consumer: true`, dead-lettering
 *   into `c`'s dead-letter queue; the exchange `c.partitions` records the count in its
 *   `alternate-exchange` argument (`nseq.partitions.<count>`), which the broker compares on every
 *   declaration, so that another count is refused with `PartitionCountMismatchError` in any order.
 *   A publish with `partition` goes to its partition's queue; a subscription with `partitions`
 *   consumes every partition queue, a consumer each with `prefetch` each. Each partition has one
 *   active consumer across all processes (the first one subscribed); the broker moves the
 *   partition, with its unacknowledged messages, to the next one when that consumer goes away.
 *   A delivery may stay unacknowledged only up to the broker's `consumer_timeout` (30 minutes by
 *   default): past it the broker closes the subscription's channel, its unsettled messages are
 *   redelivered, and the subscription consumes again on a new channel.
 * - {@link RabbitMqTransport.openReplyChannel} declares an exclusive, auto-delete queue
 *   `nseq.reply.<uuid>` on the transport's connection: the broker deletes it when it is closed or
 *   when that connection ends. A publish to a reply queue that is gone is returned by the broker
 *   (every publish is mandatory) and rejects at once with `PublishRejectedError`.
 *
 * The transport never closes an `AmqpConnection` it was given: its owner (usually golevelup's
 * `RabbitMQModule`) does. Only a transport made by {@link RabbitMqTransport.connect} closes its
 * connection on `close()`.
 *
 * @example
 * ```ts
 * SequenceModule.forRootAsync({
 *   imports: [RabbitMQModule.forRoot({ uri: process.env.AMQP_URL })],
 *   inject: [AmqpConnection],
 *   useFactory: (amqp: AmqpConnection) => ({ transport: new RabbitMqTransport(amqp) }),
 * });
 * ```
 */
export class RabbitMqTransport implements Transport {
  readonly name = 'rabbitmq';
  readonly maxMessageBytes: number;
  readonly partitioned = true;

  private readonly settings: ResolvedRabbitMqTransportOptions;
  /** `unsafeSocketTricks`, asked for and on the amqplib it was written for. */
  private readonly socketTricks: boolean;
  private readonly logger = new Logger(RabbitMqTransport.name);
  private readonly topology: RabbitMqTopology;
  private readonly subscriptions = new Set<RabbitMqSubscription>();
  private publisherChannel?: ManagedChannel;
  /** Ids of publish attempts the broker returned as unroutable (see `send`). */
  private readonly returned = new Set<string>();
  /** Ids of publish attempts awaiting their confirm: only theirs are kept when returned. */
  private readonly awaitingConfirm = new Set<string>();
  private listening?: ConnectionManager;
  /** Why the broker blocks this connection's publishes (a resource alarm), while it does. */
  private blockedBy?: string;
  private ownsConnection = false;
  private deadLetterBox?: RabbitMqDeadLetterBox;
  private closed = false;
  private closing?: Promise<void>;

  /**
   * @param connection an `AmqpConnection` that is initialized (as `RabbitMQModule` provides it)
   *   or will be before the first publish or subscribe. It stays the caller's to close.
   */
  constructor(
    private readonly connection: AmqpConnection,
    options: RabbitMqTransportOptions = {},
  ) {
    this.settings = resolveRabbitMqTransportOptions(options);
    this.maxMessageBytes = this.settings.maxMessageBytes;
    this.socketTricks = socketTricksEnabled(
      this.settings.unsafeSocketTricks,
      'amqplib',
      RabbitMqTransport.name,
    );
    this.topology = new RabbitMqTopology(
      this.settings.queueType,
      this.settings.deadLetterSuffix,
      () => this.manager(),
    );
    // Listening from the start when the connection is up already: the broker says it blocks a
    // connection once, and an alarm raised before this transport's first use would go unheard.
    if (connection.managedConnection) this.manager();
  }

  /**
   * For applications that do not use golevelup's module: opens an `AmqpConnection` of its own
   * (reconnecting automatically), waits until it is up, and returns a transport whose `close()`
   * also closes that connection.
   *
   * @param uri an AMQP URL such as `amqp://guest:guest@localhost:5672`, or several for failover.
   * @param connectionConfig further golevelup `RabbitMQConfig` settings, e.g.
   *   `connectionInitOptions.timeout` (how long to wait for the first connection, default 5000 ms)
   *   or `connectionManagerOptions.reconnectTimeInSeconds`.
   */
  static async connect(
    uri: RabbitMQConfig['uri'],
    options: RabbitMqTransportOptions = {},
    connectionConfig: Omit<RabbitMQConfig, 'uri'> = {},
  ): Promise<RabbitMqTransport> {
    resolveRabbitMqTransportOptions(options); // fail on bad options before connecting
    // Loaded here so that importing this library does not require golevelup's package.
    const { AmqpConnection: Connection } = await import('@golevelup/nestjs-rabbitmq');
    const connection = new Connection({
      enableDirectReplyTo: false,
      registerHandlers: false,
      ...connectionConfig,
      uri,
    });
    try {
      await connection.init();
    } catch (error) {
      // Otherwise it keeps retrying in the background.
      await connection.managedConnection?.close().catch(() => undefined);
      throw error;
    }
    const transport = new RabbitMqTransport(connection, options);
    transport.ownsConnection = true;
    return transport;
  }

  async publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    options: PublishOptions = {},
  ): Promise<void> {
    this.assertOpen('publish to', channel);
    assertSendable(channel, body, headers, this.maxMessageBytes);
    const timeoutMs = publishTimeoutMs(channel, options.timeoutMs, this.settings.publishTimeoutMs);
    const { partition } = options;
    if (partition === undefined) {
      await this.send(channel, body, headers, timeoutMs, options.resend ?? true);
      return;
    }
    const started = leaseClock();
    assertPartitionAddress(channel, partition, this.topology.isReplyQueue(channel));
    if (!this.topology.partitionsReady(channel, partition.count)) {
      await withTimeout(
        this.topology.ensurePartitions(channel, partition.count),
        timeoutMs,
        () => new PublishTimeoutError(channel, timeoutMs, false),
      );
    }
    const queue = this.topology.partitionQueue(channel, partition.index);
    const left = Math.max(1, timeoutMs - msSince(started));
    await this.send(queue, body, headers, left, options.resend ?? true);
  }

  async subscribe(
    channel: string,
    handler: MessageHandler,
    options: SubscribeOptions = {},
  ): Promise<Subscription> {
    this.assertOpen('subscribe to', channel);
    const { partitions } = options;
    if (partitions !== undefined) {
      const problem = partitionsProblem(partitions);
      if (problem) throw new RangeError(`subscribe to ${channel}: ${problem}`);
      if (this.topology.isReplyQueue(channel)) {
        throw new RangeError(`subscribe to ${channel}: a reply channel has no partitions`);
      }
    }
    return this.consume(
      channel,
      handler,
      options.prefetch ?? this.settings.prefetch,
      options.deadLetterChannel ?? this.deadLetterChannel(channel),
      partitions,
    );
  }

  /** Whether `channel` is one of this transport's reply channels (see the Transport port). */
  isReplyChannel(channel: string): boolean {
    return isReplyQueueName(channel);
  }

  /**
   * Declares an exclusive, auto-delete queue `nseq.reply.<uuid>` (classic, not durable, no
   * dead-letter queue) and consumes it with `prefetch`, on the transport's connection. After a
   * reconnect it is declared and consumed again, under the same name; replies that were in it when
   * the connection dropped are gone with the old connection's queue. A dead-lettered reply is
   * acked and dropped, with a warning.
   */
  async openReplyChannel(
    handler: MessageHandler,
    options: ReplyChannelOptions = {},
  ): Promise<Subscription> {
    this.assertOpen('open', 'a reply channel');
    const queue = `${REPLY_QUEUE_PREFIX}${randomUUID()}`;
    return this.consume(queue, handler, options.prefetch ?? DEFAULT_REPLY_PREFETCH, undefined);
  }

  private async consume(
    channel: string,
    handler: MessageHandler,
    prefetch: number,
    deadLetterChannel: string | undefined,
    partitions?: number,
  ): Promise<Subscription> {
    const problem = prefetchProblem(prefetch);
    if (problem) throw new RangeError(problem);
    // Before the subscription is held: it throws when the AmqpConnection is not initialized.
    const manager = this.manager();
    const subscription = new RabbitMqSubscription({
      channel,
      partitions,
      handler,
      prefetch,
      startTimeoutMs: this.settings.subscribeTimeoutMs,
      deadLetterChannel,
      topology: this.topology,
      // Not size-checked: the broker already holds this message, and refusing to forward it (as a
      // dead letter or a requeued copy) would requeue it forever.
      publish: async (target, body, headers) => {
        assertEncodableHeaders(target, headers);
        await this.send(target, body, headers, this.settings.publishTimeoutMs);
      },
      logger: this.logger,
      onClosed: (closed) => this.subscriptions.delete(closed),
    });
    this.subscriptions.add(subscription);
    // On a failure it closes, which takes it out of the set (onClosed).
    await subscription.start(manager);
    return subscription;
  }

  /** `<channel><deadLetterSuffix>`: `<channel>.dlq` unless the `deadLetterSuffix` option says. */
  deadLetterChannel(channel: string): string {
    return this.topology.deadLetterQueue(channel);
  }

  /**
   * The dead letters ready in this transport's dead-letter queues, to browse, replay and discard.
   * RabbitMQ cannot read a queue without taking from it: each call takes up to 1,000 messages
   * from the head with `basic.get` and puts back, within the call, those it does not remove
   * (docs/transports.md tells what that means for a consumer of the dead-letter queue). Replays
   * go through `publish` and are acked only after the confirm.
   */
  deadLetters(): DeadLetterBox {
    this.deadLetterBox ??= new RabbitMqDeadLetterBox({
      connection: () => {
        this.assertOpen('read', 'dead letters');
        const connection = this.manager().connection;
        if (!connection)
          throw new BrokerUnavailableError('rabbitmq', 'reconnecting', NOT_CONNECTED);
        return connection;
      },
      publish: (channel, body, headers) => this.publish(channel, body, headers),
      deadLetterChannel: (channel) => this.deadLetterChannel(channel),
    });
    return this.deadLetterBox;
  }

  /**
   * Closes every subscription (their unsettled messages return to the broker) and the transport's
   * publishing channel; pending publishes reject. Closes the `AmqpConnection` only when
   * {@link RabbitMqTransport.connect} made it. Idempotent.
   */
  close(): Promise<void> {
    this.closing ??= this.shutdown();
    return this.closing;
  }

  private async shutdown(): Promise<void> {
    this.closed = true;
    // Bounded: a channel close the broker never answers must not hold the application's shutdown
    // (closing the connection, when it is ours, then ends those channels anyway).
    const timeoutMs = this.settings.publishTimeoutMs;
    await withTimeout(
      Promise.all([...this.subscriptions].map((subscription) => subscription.close())),
      timeoutMs,
      () => new Error(`subscriptions still closing after ${timeoutMs} ms; not awaited`),
    ).catch((error: unknown) => this.logger.warn(`closing the transport: ${errorMessage(error)}`));
    this.topology.dispose();
    this.unlisten();
    // Each close waits for the broker's answer: bounded too, for a broker that stopped answering
    // (frozen, a network black hole), which amqplib's heartbeats would only notice later.
    const bounded = (closing: Promise<unknown>, what: string) =>
      withTimeout(
        closing,
        timeoutMs,
        () => new Error(`${what} still closing after ${timeoutMs} ms; not awaited`),
      );
    await bounded(
      this.publisherChannel?.close() ?? Promise.resolve(),
      'the publishing channel',
    ).catch(() => undefined);
    this.publisherChannel = undefined;
    if (this.ownsConnection) {
      await bounded(this.connection.close(), 'the connection').catch((error: unknown) => {
        this.logger.warn(`closing the transport: ${errorMessage(error)}`);
        // golevelup closes its channels before the connection manager: stuck on them, it never
        // told the manager, which would reconnect for ever once the socket died. The manager
        // stops reconnecting at once; its close completes, or ends with the socket.
        void this.connection.managedConnection?.close().catch(() => undefined);
      });
    }
  }

  /**
   * Publishes and waits for the confirm, all within `timeoutMs`: a lost connection is waited for,
   * and a message in flight when it dropped is sent again on the next one (at least once). With
   * `resend` false, a message handed over is never sent again: the first failure is final.
   */
  private async send(
    channel: string,
    body: Buffer,
    headers: Record<string, unknown>,
    timeoutMs: number,
    resend = true,
  ): Promise<void> {
    // The callers have checked the headers (assertEncodableHeaders): one amqplib fails to encode
    // would leave a confirm callback behind that no message owns. So is the queue's name: one it
    // fails to encode fails in the channel wrapper, which would tear the channel down.
    const problem = queueNameProblem(channel);
    if (problem !== undefined) throw new RabbitMqTopologyError(channel, 0, new Error(problem));
    const started = leaseClock();
    const left = () => timeoutMs - msSince(started);
    let handedOver = false;
    const timedOut = () => new PublishTimeoutError(channel, timeoutMs, handedOver);
    for (;;) {
      // Declared already (every publish but a channel's first): no timer, no promise to wait on.
      if (!this.topology.isReady(channel)) {
        await withTimeout(this.topology.ensure(channel), left(), timedOut);
      }
      // Mandatory, with an id of this attempt: a message no queue takes (its queue was deleted
      // while we were connected) comes back as a return before its confirm, instead of being
      // confirmed and dropped. It is then declared again and sent again.
      const attempt = randomUUID();
      // Closed while the channel was being declared: no publishing channel may open after close().
      if (this.closed)
        throw handedOver
          ? timedOut()
          : new Error(`rabbitmq transport is closed: cannot publish to ${channel}`);
      this.awaitingConfirm.add(attempt);
      try {
        handedOver = true;
        const confirmed = this.publisher().publish('', channel, body, {
          persistent: true,
          headers,
          mandatory: true,
          messageId: attempt,
          // The wrapper's own timer, until the confirm: it rejects with CONFIRM_TIMEOUT (mapped
          // below) and drops the message from its queue, so it is not sent after we gave up.
          timeout: Math.max(1, left()),
        });
        await confirmed;
        this.awaitingConfirm.delete(attempt);
        if (!this.returned.delete(attempt)) return;
        if (this.topology.isReplyQueue(channel)) {
          // Declared by its consumer alone: returned, it is closed (or its process gone) for good.
          const returned = new Error('returned by the broker as unroutable');
          throw new PublishRejectedError(channel, returned, 'the reply queue is gone');
        }
        this.logger.warn(
          `${channel}: the broker returned a message as unroutable; ` +
            (resend ? 'declaring again' : 'not sent again (resend: false)'),
        );
        this.topology.forgetChannel(channel);
        if (!resend) {
          const returned = new Error('returned by the broker as unroutable');
          throw new PublishRejectedError(channel, returned, 'returned as unroutable');
        }
        if (left() <= 0) throw timedOut();
        continue;
      } catch (error) {
        this.awaitingConfirm.delete(attempt);
        this.returned.delete(attempt);
        if (error instanceof PublishTimeoutError || error instanceof PublishRejectedError) {
          throw error;
        }
        const message = (error as Error | undefined)?.message;
        if (message === CONFIRM_TIMEOUT) throw timedOut();
        if (message === NEGATIVE_CONFIRM) throw new PublishRejectedError(channel, error as Error);
        // Closed while a message was handed over: it may have reached the broker.
        if (this.closed) throw handedOver ? timedOut() : error;
        if (!resend) {
          const why = `its channel closed before the confirm (${errorMessage(error)}); not sent again`;
          throw new PublishTimeoutError(channel, timeoutMs, true, why);
        }
        if (left() <= 0) throw timedOut();
        await delay(10); // the channel closed before the confirm: send again
      }
    }
  }

  /** The transport's confirm channel for publishing, created on first use. */
  private publisher(): ManagedChannel {
    if (this.publisherChannel) return this.publisherChannel;
    if (this.closed) throw new Error('rabbitmq transport is closed: no publishing channel opens');
    const wrapper = this.manager().createChannel({
      name: 'nest-sequence publisher',
      confirm: true,
      setup: async (amqp: ConfirmChannel) => {
        amqp.on('return', (message: { properties: { messageId?: unknown } }) => {
          const id = message.properties.messageId;
          // A return after its attempt gave up (timed out) would stay in the set for ever.
          if (typeof id === 'string' && this.awaitingConfirm.has(id)) this.returned.add(id);
        });
        amqp.on('error', (error: Error) => {
          // The broker closed this channel (not the connection), e.g. for a message over its
          // max_message_size. The wrapper would only reopen it after a reconnect: replace it.
          this.logger.warn(`publishing channel closed by the broker: ${error.message}`);
          if (this.publisherChannel === wrapper) this.publisherChannel = undefined;
          void wrapper.close().catch(() => undefined);
        });
      },
    });
    wrapper.on('error', (error: Error) => {
      // The wrapper would wait for a reconnect that may never come (the connection is up, say at
      // its channel_max), holding every publish until its timeout: the next publish opens anew.
      this.logger.error(`publishing channel could not be opened: ${error.message}`);
      if (this.publisherChannel === wrapper) this.publisherChannel = undefined;
      void wrapper.close().catch(() => undefined);
    });
    this.publisherChannel = wrapper;
    return wrapper;
  }

  async ping(): Promise<void> {
    if (this.closed) throw new Error('rabbitmq transport is closed');
    if (!this.manager().isConnected()) {
      throw new BrokerUnavailableError('rabbitmq', 'reconnecting', NOT_CONNECTED);
    }
    // Connected, but the broker holds every publish of this connection until a resource alarm
    // clears (memory or disk): as unable to publish as a lost connection, and for as long.
    if (this.blockedBy !== undefined) {
      throw new BrokerUnavailableError(
        'rabbitmq',
        'blocked',
        `RabbitMQ has blocked publishing on this connection: ${this.blockedBy}`,
      );
    }
  }

  /** golevelup's connection manager (amqp-connection-manager), which reconnects on its own. */
  private manager(): ConnectionManager {
    const manager = this.connection.managedConnection as ConnectionManager | undefined;
    if (!manager) {
      throw new Error(
        'RabbitMqTransport: the AmqpConnection is not initialized; call its init() first ' +
          '(RabbitMQModule does) or use RabbitMqTransport.connect(url)',
      );
    }
    if (this.listening !== manager) {
      this.unlisten();
      manager.on('disconnect', this.onDisconnect);
      manager.on('connect', this.onConnect);
      manager.on('blocked', this.onBlocked);
      manager.on('unblocked', this.onUnblocked);
      this.listening = manager;
      this.applySocketTricks(manager.connection);
    }
    return manager;
  }

  /** Stops listening to the connection manager this transport listened to, if any. */
  private unlisten(): void {
    const manager = this.listening;
    if (!manager) return;
    manager.removeListener('disconnect', this.onDisconnect);
    manager.removeListener('connect', this.onConnect);
    manager.removeListener('blocked', this.onBlocked);
    manager.removeListener('unblocked', this.onUnblocked);
    this.listening = undefined;
  }

  /**
   * A new connection: the broker says again if it blocks this one. Never throws:
   * amqp-connection-manager emits 'connect' inside its connect chain, where a throwing listener
   * would count the connection as failed.
   */
  private readonly onConnect = ({ connection }: { connection: unknown }): void => {
    this.blockedBy = undefined;
    this.applySocketTricks(connection);
  };

  /**
   * With `unsafeSocketTricks`, has amqplib's `connection` write the frames of one pass in one go
   * (amqp-frame-writes) and assemble large bodies in place as their frames come
   * (amqp-content-reads). Never throws: an amqplib of another shape is left as it is.
   */
  private applySocketTricks(connection: unknown): void {
    if (!this.socketTricks) return;
    try {
      coalesceFrameWrites(connection);
      assembleContentInPlace(connection);
    } catch {
      // left as amqplib made it
    }
  }

  /**
   * The broker's `connection.blocked` (a memory or disk alarm), sent once the connection
   * publishes while an alarm is on; `connection.unblocked` when it clears.
   */
  private readonly onBlocked = ({ reason }: { reason?: unknown }): void => {
    this.blockedBy = typeof reason === 'string' && reason !== '' ? reason : 'resource alarm';
    this.logger.warn(`RabbitMQ blocked publishing on this connection: ${this.blockedBy}`);
  };

  private readonly onUnblocked = (): void => {
    if (this.blockedBy !== undefined) this.logger.log('RabbitMQ unblocked publishing again');
    this.blockedBy = undefined;
  };

  private readonly onDisconnect = (): void => {
    this.blockedBy = undefined;
    this.topology.forget();
    // The publishing channel would keep what it holds for the next connection, and a message it
    // put back in its queue there has no timer left. Closed, it rejects them all ('Channel
    // closed'): `send` sends each again on a fresh channel, within its own deadline.
    const publisher = this.publisherChannel;
    this.publisherChannel = undefined;
    void publisher?.close().catch(() => undefined);
  };

  private assertOpen(action: string, channel: string): void {
    if (this.closed) throw new Error(`rabbitmq transport is closed: cannot ${action} ${channel}`);
  }
}

/** Throws a RangeError unless `partition` names a partition of a usable count. */
function assertPartitionAddress(
  channel: string,
  partition: PartitionAddress,
  replyChannel: boolean,
): void {
  const problem = partitionAddressProblem(partition);
  if (problem) throw new RangeError(`publish to ${channel}: ${problem}`);
  if (replyChannel)
    throw new RangeError(`publish to ${channel}: a reply channel has no partitions`);
}
