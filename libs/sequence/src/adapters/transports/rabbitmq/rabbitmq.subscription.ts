import type { Logger } from '@nestjs/common';
import type { Channel, ConsumeMessage } from 'amqplib';
import { withTimeout } from '../../../core/async';
import { SubscribeError } from '../../../core/errors/subscribe.error';
import { errorMessage } from '../../../core/errors/caught';
import { SequenceHeader } from '../../../core/headers';
import {
  deadLetterHeaders,
  droppedReplyWarning,
  REQUEUE_COUNT_HEADER,
  requeueCount,
  toDisposition,
  withRequeueCount,
  type Disposition,
  type InboundMessage,
  type MessageHandler,
  type Subscription,
} from '../../../ports/transport.port';
import { forwardableHeaders } from '../../../ports/transport-headers';
import { recycleBody } from '../body-pool';
import { Forwards } from '../forwards';
import type { ConnectionManager, ManagedChannel } from './amqp.types';
import type { RabbitMqTopology } from './rabbitmq.topology';

export interface RabbitMqSubscriptionSettings {
  readonly channel: string;
  /**
   * Consume every partition of `channel` split into this many (each queue with a consumer of its
   * own, `prefetch` each) instead of the channel's own queue.
   */
  readonly partitions?: number;
  readonly handler: MessageHandler;
  readonly prefetch: number;
  /** How long `start`, when connected, waits for the consumer to be registered. */
  readonly startTimeoutMs: number;
  /** Undefined for a reply queue: a dead-lettered reply is dropped (acked) with a warning. */
  readonly deadLetterChannel: string | undefined;
  readonly topology: RabbitMqTopology;
  /**
   * Publishes a message to a queue and resolves on the broker's confirm: dead letters, and the
   * copies that delayed requeues put at the tail of the queue.
   */
  readonly publish: (
    channel: string,
    body: Buffer,
    headers: Record<string, unknown>,
  ) => Promise<void>;
  readonly logger: Logger;
  /** Called once the subscription has closed. */
  readonly onClosed: (subscription: RabbitMqSubscription) => void;
}

/** How long a message whose dead letter or tail copy could not be published waits to go back. */
export const FAILED_FORWARD_PAUSE_MS = 1_000;

/** A queue this subscription consumes: the channel's own, or one of its partitions. */
interface Source {
  readonly queue: string;
  readonly partition?: number;
}

/** A message in a handler's hands, with the channel that must settle it. */
interface Delivery {
  readonly amqp: Channel;
  readonly message: ConsumeMessage;
  readonly source: Source;
  /** Aborted once its channel closed or this subscription started closing. */
  readonly abandoned: AbortSignal;
  /** The handler released the body (`InboundMessage.releaseBody`): `message.content` is empty. */
  released?: boolean;
}

const NO_BODY = Buffer.alloc(0);

/** Waits before reopening a channel the broker closed: doubling from the first, up to the last. */
const REOPEN_FIRST_DELAY_MS = 100;
const REOPEN_MAX_DELAY_MS = 30_000;

/**
 * One consumer on a channel of its own (so that `prefetch` and `close` concern it alone), with
 * manual acknowledgement. The channel's setup function declares the queues, sets the prefetch and
 * starts consuming; the connection manager runs it again on every reconnect, which is how a
 * subscription survives a dropped connection. Deliveries are settled on the amqplib channel that
 * delivered them and only while it is open: an ack on a later channel would be an unknown
 * delivery tag, which the broker punishes by closing that channel.
 *
 * The broker may also close the channel alone, leaving the connection up: for an unknown delivery
 * tag, a refused declaration (404, 406), or RabbitMQ's `consumer_timeout`. That last one closes
 * the channel (406 PRECONDITION_FAILED, "delivery acknowledgement on channel N timed out") when a
 * delivery stays unacknowledged longer than the broker's `consumer_timeout` (30 minutes by default
 * since RabbitMQ 3.8.15). Here a delivery stays unacknowledged for as long as its handler runs,
 * plus `delayMs` for a delayed requeue (the message is held during the delay): both together must
 * stay well below `consumer_timeout`. amqp-connection-manager reopens channels only on reconnect,
 * so this subscription replaces its channel itself, after a backoff; the closed channel's
 * unsettled messages are redelivered, and its handlers' late verdicts are ignored.
 *
 * A `requeue` with `delayMs` holds the delivery (and its prefetch slot) for the delay, then
 * publishes a copy (body and headers, with `x-requeue-count` incremented; other AMQP properties are
 * not carried) to the tail of the queue with a publisher confirm and acks the original. A plain
 * `basic.nack` with requeue would put it back at the head, where a message that is always
 * back-pressured would be delivered first forever and starve the ones behind it. The copy arrives
 * with the broker's `redelivered` flag unset: `x-requeue-count` is what marks it redelivered.
 *
 * With `partitions`, it consumes each partition queue of the channel (see `RabbitMqTopology`) on
 * its one channel, a consumer per queue: `basic.qos` applies per consumer, so `prefetch` is per
 * partition. The queues have single active consumer: the broker makes this consumer the active one
 * of a partition only when no earlier consumer of it is left. A `consumer_timeout` closes the
 * channel and so every partition's consumer: the broker redelivers their unsettled messages (to
 * the next consumer in line, when there is one), and the new channel consumes them all again.
 */
export class RabbitMqSubscription implements Subscription {
  readonly channel: string;

  private manager?: ConnectionManager;
  private wrapper?: ManagedChannel;
  private readonly sources: readonly Source[];
  /** The consumers of the current channel, one per source. */
  private consumers: Array<{
    readonly amqp: Channel;
    readonly source: Source;
    readonly consumerTag: string;
  }> = [];
  /** amqplib channels of this subscription that are still open. */
  private readonly openChannels = new WeakSet<Channel>();
  private readonly unsettled = new Set<Delivery>();
  /** Per open channel: aborted when it closes (the broker has its unsettled messages back). */
  private readonly channelLost = new Map<Channel, AbortController>();
  private readonly requeueTimers = new Set<NodeJS.Timeout>();
  /** Dead letters and requeued copies being published; their originals are acked after. */
  private readonly forwards: Forwards;
  private reopenTimer?: NodeJS.Timeout;
  private reopenAttempts = 0;
  private callerAwaitsStart = false;
  private closed = false;
  private closing?: Promise<void>;

  constructor(private readonly settings: RabbitMqSubscriptionSettings) {
    this.channel = settings.channel;
    this.forwards = new Forwards(settings.channel, settings.logger);
    const { topology, partitions } = settings;
    this.sources =
      partitions === undefined
        ? [{ queue: settings.channel }]
        : Array.from({ length: partitions }, (_, partition) => ({
            queue: topology.partitionQueue(settings.channel, partition),
            partition,
          }));
  }

  /**
   * Opens the channel and starts consuming. Resolves once the consumer is registered, or at once
   * when there is no connection (it starts when one comes). Rejects, and closes, when the first
   * setup fails, when the channel cannot be created or opened (`SubscribeError`,
   * `channel-not-opened` for the latter), or after `startTimeoutMs` (`SubscribeError`, `timeout`).
   */
  async start(manager: ConnectionManager): Promise<void> {
    this.manager = manager;
    // When connected, the caller waits for the first setup and hears of its failure; otherwise
    // (and on every reconnect or reopening) a failure goes to the log.
    const connected = manager.isConnected();
    this.callerAwaitsStart = connected;
    const timeoutMs = this.settings.startTimeoutMs;
    try {
      // Inside the try: a channel that cannot even be created closes this subscription too.
      const started = this.open(manager);
      if (!connected) return;
      // Bounded: the broker may leave the channel's opening or a declaration unanswered (a
      // connection it blocks on a resource alarm still answers heartbeats).
      await withTimeout(
        started,
        timeoutMs,
        () => new SubscribeError(this.channel, 'timeout', `not consuming after ${timeoutMs} ms`),
      );
    } catch (error) {
      if (error instanceof SubscribeError) {
        // Not awaited: closing an open channel waits for the broker's answer, perhaps the very
        // one that never came. A channel that opens later closes itself (see open).
        void this.close();
      } else {
        await this.close();
      }
      throw error;
    }
  }

  /**
   * Cancels the consumers (of a plain channel) and closes the channel; the broker requeues what
   * was not settled.
   */
  close(): Promise<void> {
    this.closing ??= this.shutdown();
    return this.closing;
  }

  private async shutdown(): Promise<void> {
    this.closed = true;
    // Verdicts are ignored from here on: the channel's close gives everything back.
    for (const lost of this.channelLost.values()) lost.abort();
    clearTimeout(this.reopenTimer);
    for (const timer of this.requeueTimers) clearTimeout(timer);
    this.requeueTimers.clear();
    // A dead letter or requeued copy already on its way gets its ack, so it is not sent twice.
    await this.forwards.settled();
    this.unsettled.clear();
    // A partition's consumer is not cancelled first: with single active consumer the broker would
    // hand the partition to the next subscriber at once, while this channel still holds what it
    // has not settled, and messages published meanwhile would reach that one before them. The
    // channel's close requeues what it holds and ends its consumers in one step.
    if (this.settings.partitions === undefined) {
      for (const consumer of this.consumers) {
        if (this.openChannels.has(consumer.amqp)) {
          await consumer.amqp.cancel(consumer.consumerTag).catch(() => undefined);
        }
      }
    }
    await this.wrapper?.close().catch(() => undefined);
    this.settings.onClosed(this);
  }

  /** A channel wrapper whose setup consumes; resolves once its first setup has succeeded. */
  private open(manager: ConnectionManager): Promise<void> {
    let firstSetup!: { resolve: () => void; reject: (error: unknown) => void };
    const started = new Promise<void>((resolve, reject) => (firstSetup = { resolve, reject }));
    const wrapper: ManagedChannel = manager.createChannel({
      name: `nest-sequence consumer of ${this.channel}`,
      confirm: false,
      setup: async (amqp: Channel) => {
        if (this.closed) {
          // Closed while this channel was being opened: wrapper.close() found no channel to
          // close then. A consumer started here would hold up to `prefetch` messages unacked,
          // with nobody to settle them or to close it.
          if (this.callerAwaitsStart) {
            firstSetup.reject(
              new SubscribeError(this.channel, 'closed', 'closed before it was consuming'),
            );
          }
          await amqp.close().catch(() => undefined);
          return;
        }
        try {
          await this.setup(wrapper, amqp);
          this.reopenAttempts = 0;
          firstSetup.resolve();
        } catch (error) {
          if (!this.callerAwaitsStart) throw error; // reported through the 'error' event
          firstSetup.reject(error);
        } finally {
          this.callerAwaitsStart = false;
        }
      },
    });
    wrapper.on('error', (error: Error) => {
      // During the first setup, a failure of the setup reaches the caller through `started`:
      // an error here means the channel itself could not be opened. The setup then never runs,
      // and `started` would wait for a reconnect that may never come (the connection may well
      // be up, e.g. with no channel number left on it).
      if (this.callerAwaitsStart) {
        firstSetup.reject(
          new SubscribeError(this.channel, 'channel-not-opened', error.message, error),
        );
        return;
      }
      this.settings.logger.error(
        `subscription to ${this.channel} could not start consuming: ${error.message}; ` +
          `it tries again after the next reconnect or reopening`,
      );
    });
    this.wrapper = wrapper;
    return started;
  }

  private async setup(wrapper: ManagedChannel, amqp: Channel): Promise<void> {
    this.openChannels.add(amqp);
    const lost = new AbortController();
    this.channelLost.set(amqp, lost);
    amqp.once('close', () => {
      this.openChannels.delete(amqp);
      this.channelLost.delete(amqp);
      lost.abort();
    });
    // Emitted when the broker closes this channel alone (a lost connection only emits 'close').
    // Without a listener, amqplib would throw it.
    amqp.on('error', (error: Error) => this.onChannelError(wrapper, error));
    await this.consumeOn(amqp);
  }

  private onChannelError(wrapper: ManagedChannel, error: Error): void {
    // During the first setup, the caller of subscribe() gets this error and closes.
    if (this.callerAwaitsStart || this.closed || wrapper !== this.wrapper) return;
    const delayMs = Math.min(REOPEN_FIRST_DELAY_MS * 2 ** this.reopenAttempts, REOPEN_MAX_DELAY_MS);
    this.reopenAttempts++;
    this.settings.logger.warn(
      `the broker closed the channel of the subscription to ${this.channel}: ${error.message}; ` +
        `its unsettled messages will be redelivered, and a new channel opens in ${delayMs} ms`,
    );
    // The wrapper would only open a new channel after a reconnect: replace it.
    this.wrapper = undefined;
    void wrapper.close().catch(() => undefined);
    this.reopenTimer = setTimeout(() => {
      this.reopenTimer = undefined;
      if (!this.closed && this.manager) void this.open(this.manager);
    }, delayMs);
  }

  private async consumeOn(amqp: Channel): Promise<void> {
    const { topology, partitions, prefetch } = this.settings;
    if (partitions === undefined) await topology.declareOn(amqp, this.channel);
    // On a channel of its own: a count other than the channel's is refused by closing the channel.
    else await topology.ensurePartitions(this.channel, partitions);
    // Per consumer (not global): each partition's consumer has `prefetch` of its own.
    await amqp.prefetch(prefetch);
    this.consumers = this.consumers.filter((consumer) => consumer.amqp === amqp);
    for (const source of this.sources) await this.consumeQueue(amqp, source);
  }

  private async consumeQueue(amqp: Channel, source: Source): Promise<void> {
    const { consumerTag } = await amqp.consume(
      source.queue,
      (message) => this.receive(amqp, source, message),
      { noAck: false },
    );
    this.consumers.push({ amqp, source, consumerTag });
  }

  private receive(amqp: Channel, source: Source, message: ConsumeMessage | null): void {
    if (message === null) {
      // The broker cancelled the consumer, e.g. because the queue was deleted: start over.
      if (this.closed || !this.openChannels.has(amqp)) return;
      // Its tag is gone with it: only live consumers are cancelled at close.
      this.consumers = this.consumers.filter(
        (consumer) => consumer.amqp !== amqp || consumer.source !== source,
      );
      this.settings.logger.warn(`the broker cancelled the consumer of ${source.queue}; resuming`);
      this.resume(amqp, source).catch((error: Error) =>
        this.settings.logger.error(`could not resume consuming ${source.queue}: ${error.message}`),
      );
      return;
    }
    // Closing: leave it unsettled, the channel's close hands it back to the broker.
    if (this.closed) return;
    const abandoned = this.channelLost.get(amqp)?.signal ?? AbortSignal.abort();
    const delivery: Delivery = { amqp, message, source, abandoned };
    this.unsettled.add(delivery);
    void this.handle(delivery);
  }

  /** Declares a queue whose consumer the broker cancelled again, and consumes it again. */
  private async resume(amqp: Channel, source: Source): Promise<void> {
    const { topology, partitions } = this.settings;
    if (partitions === undefined) {
      await topology.declareOn(amqp, source.queue);
    } else {
      // Its queue was deleted: declared again on the next `ensurePartitions`.
      topology.forgetChannel(source.queue);
      await topology.ensurePartitions(this.channel, partitions);
    }
    if (this.closed || !this.openChannels.has(amqp)) return;
    await this.consumeQueue(amqp, source);
  }

  private async handle(delivery: Delivery): Promise<void> {
    let outcome: unknown;
    try {
      outcome = await this.settings.handler(this.inbound(delivery));
    } catch {
      outcome = undefined; // a failing handler means requeue
    }
    this.settle(delivery, toDisposition(outcome));
  }

  /**
   * The message as the handler sees it. Its `releaseBody` empties the body here and in the
   * delivery kept for the ack, so that nothing of this subscription holds it any more.
   */
  private inbound(delivery: Delivery): InboundMessage {
    const { message, source } = delivery;
    const headers = { ...(message.properties.headers ?? {}) };
    const inbound: { -readonly [K in keyof InboundMessage]: InboundMessage[K] } = {
      channel: this.channel,
      body: message.content,
      headers,
      // A copy put at the tail by a delayed requeue is a new message to the broker.
      redelivered: message.fields.redelivered || requeueCount(headers) > 0,
      ...(source.partition === undefined ? {} : { partition: source.partition }),
      abandoned: delivery.abandoned,
      releaseBody: () => {
        delivery.released = true;
        const body = delivery.message.content;
        delivery.message.content = NO_BODY;
        // With unsafeSocketTricks, a large body goes back to the connection for the next one.
        recycleBody(body);
        inbound.body = NO_BODY;
      },
    };
    return inbound;
  }

  private settle(delivery: Delivery, disposition: Disposition): void {
    // After close, the broker has the message back (or soon will): a late verdict changes nothing.
    if (this.closed || !this.unsettled.has(delivery)) return;
    if (disposition.action === 'ack') {
      this.finish(delivery, 'ack');
    } else if (disposition.action === 'requeue') {
      const delayMs = disposition.delayMs ?? 0;
      if (delayMs <= 0) {
        this.finish(delivery, 'requeue');
        return;
      }
      if (!this.bodyFor(delivery, disposition)) return;
      // Held (and counted against prefetch) until the delay passes: that is the back-pressure.
      this.holdFor(delayMs, () =>
        this.forwards.add(this.requeueAtTail(delivery, this.bodyFor(delivery, disposition)!)),
      );
    } else if (this.settings.deadLetterChannel === undefined) {
      this.settings.logger.warn(droppedReplyWarning(this.channel, disposition.reason));
      this.finish(delivery, 'ack');
    } else {
      const body = this.bodyFor(delivery, disposition);
      if (!body) return;
      this.forwards.add(
        this.deadLetterThenAck(delivery, this.settings.deadLetterChannel, disposition.reason, body),
      );
    }
  }

  /**
   * The body a dead letter or a copy at the tail carries: the disposition's, else the message's
   * own. A message whose body the handler released and did not give back goes back to its queue
   * instead, whole (the broker still has it): undefined then, and the message is settled.
   */
  private bodyFor(
    delivery: Delivery,
    disposition: Extract<Disposition, { body?: Buffer }>,
  ): Buffer | undefined {
    if (disposition.body) return disposition.body;
    if (!delivery.released) return delivery.message.content;
    this.settings.logger.warn(
      `a message of ${delivery.source.queue} was to be ${disposition.action === 'dead-letter' ? 'dead-lettered' : 'requeued behind the queued ones'} ` +
        'after its handler released its body, without the body: returned to its queue instead',
    );
    this.finish(delivery, 'requeue');
    return undefined;
  }

  /**
   * The original is acked only once its copy at the tail is confirmed; if that fails, it goes back
   * to the head as a plain requeue would, rather than being lost.
   */
  private async requeueAtTail(delivery: Delivery, body: Buffer): Promise<void> {
    const { amqp, message } = delivery;
    // Its channel closed during the delay: the broker has already put it back; a copy would be a
    // duplicate.
    if (!this.openChannels.has(amqp)) {
      this.unsettled.delete(delivery);
      return;
    }
    const headers = forwardableHeaders(withRequeueCount(message.properties.headers ?? {}), [
      REQUEUE_COUNT_HEADER,
    ]);
    try {
      // The tail of the queue it came from: its partition's, for a partitioned channel.
      await this.settings.publish(delivery.source.queue, body, headers);
      this.finish(delivery, 'ack');
    } catch (error) {
      this.settings.logger.warn(
        `could not requeue a message of ${delivery.source.queue} behind the queued ones: ` +
          `${errorMessage(error)}; returning it to the head of the queue in ` +
          `${FAILED_FORWARD_PAUSE_MS} ms instead`,
      );
      this.requeueAfterPause(delivery);
    }
  }

  /** The original is acked only once its dead letter is confirmed; if that fails, it is requeued. */
  private async deadLetterThenAck(
    delivery: Delivery,
    deadLetterChannel: string,
    reason: string,
    body: Buffer,
  ): Promise<void> {
    const { amqp, message } = delivery;
    // Its channel closed before the verdict: the broker has put it back (and may have delivered
    // it again already); a dead letter now would be a second copy of a message still in play.
    if (!this.openChannels.has(amqp)) {
      this.unsettled.delete(delivery);
      return;
    }
    // Headers of a message another program published may be ones amqplib cannot send again: a
    // dead letter carries what it can rather than failing (and its message looping) on them.
    const headers = forwardableHeaders(
      deadLetterHeaders(message.properties.headers ?? {}, reason),
      [SequenceHeader.deathReason],
    );
    try {
      await this.settings.publish(deadLetterChannel, body, headers);
      this.finish(delivery, 'ack');
    } catch (error) {
      this.settings.logger.warn(
        `could not dead-letter a message of ${this.channel} to ${deadLetterChannel} ` +
          `(${reason}): ${errorMessage(error)}; requeuing it in ${FAILED_FORWARD_PAUSE_MS} ms`,
      );
      this.requeueAfterPause(delivery);
    }
  }

  /**
   * Back to the head of the queue, after a pause: a dead-letter queue that refuses every copy (a
   * length limit with reject-publish, a queue declared otherwise) must not make its message come
   * straight back, again and again, each time through the handler. Held meanwhile, the message
   * keeps one of the subscriber's prefetch slots: that is the back-pressure.
   */
  private requeueAfterPause(delivery: Delivery): void {
    this.holdFor(FAILED_FORWARD_PAUSE_MS, () => this.finish(delivery, 'requeue'));
  }

  /** Runs `then` after `ms`, unless the subscription closes first (its timers are cleared). */
  private holdFor(ms: number, then: () => void): void {
    // Closing (a forward failed while the close waited for it): the channel's close gives the
    // message back; a timer now would only keep the process alive.
    if (this.closed) return;
    const timer = setTimeout(() => {
      this.requeueTimers.delete(timer);
      then();
    }, ms);
    this.requeueTimers.add(timer);
  }

  private finish(delivery: Delivery, outcome: 'ack' | 'requeue'): void {
    if (!this.unsettled.delete(delivery)) return;
    const { amqp, message } = delivery;
    // Its channel is gone: the broker has already put the message back.
    if (!this.openChannels.has(amqp)) return;
    try {
      if (outcome === 'ack') amqp.ack(message);
      else amqp.nack(message, false, true);
    } catch {
      // The channel closed between the check and the call: same as above.
    }
  }
}
