import type { Logger } from '@nestjs/common';
import type { Channel, ConsumeMessage } from 'amqplib';
import { SequenceHeader } from '../../../core/headers';
import {
  toDisposition,
  type Disposition,
  type InboundMessage,
  type MessageHandler,
  type Subscription,
} from '../../../ports/transport.port';
import type { ConnectionManager, ManagedChannel } from './amqp.types';
import type { RabbitMqTopology } from './rabbitmq.topology';

export interface RabbitMqSubscriptionSettings {
  readonly channel: string;
  readonly handler: MessageHandler;
  readonly prefetch: number;
  readonly deadLetterChannel: string;
  readonly topology: RabbitMqTopology;
  /** Publishes a dead letter and resolves on the broker's confirm. */
  readonly deadLetter: (
    channel: string,
    body: Buffer,
    headers: Record<string, unknown>,
  ) => Promise<void>;
  readonly logger: Logger;
  /** Called once the subscription has closed. */
  readonly onClosed: (subscription: RabbitMqSubscription) => void;
}

/** A message in a handler's hands, with the channel that must settle it. */
interface Delivery {
  readonly amqp: Channel;
  readonly message: ConsumeMessage;
}

/**
 * One consumer on a channel of its own (so that `prefetch` and `close` concern it alone), with
 * manual acknowledgement. The channel's setup function declares the queues, sets the prefetch and
 * starts consuming; the connection manager runs it again on every reconnect, which is how a
 * subscription survives a dropped connection. Deliveries are settled on the amqplib channel that
 * delivered them and only while it is open: an ack on a later channel would be an unknown
 * delivery tag, which the broker punishes by closing that channel.
 */
export class RabbitMqSubscription implements Subscription {
  readonly channel: string;

  private wrapper?: ManagedChannel;
  private consumer?: { readonly amqp: Channel; readonly consumerTag: string };
  /** amqplib channels of this subscription that are still open. */
  private readonly openChannels = new WeakSet<Channel>();
  private readonly unsettled = new Set<Delivery>();
  private readonly requeueTimers = new Set<NodeJS.Timeout>();
  private readonly deadLettering = new Set<Promise<void>>();
  private callerAwaitsStart = false;
  private closed = false;
  private closing?: Promise<void>;

  constructor(private readonly settings: RabbitMqSubscriptionSettings) {
    this.channel = settings.channel;
  }

  /**
   * Opens the channel and starts consuming. Resolves once the consumer is registered, or at once
   * when there is no connection (it starts when one comes); rejects when the first setup fails.
   */
  async start(manager: ConnectionManager): Promise<void> {
    let firstSetup!: { resolve: () => void; reject: (error: unknown) => void };
    const started = new Promise<void>((resolve, reject) => (firstSetup = { resolve, reject }));
    // When connected, the caller waits for the first setup and hears of its failure; otherwise
    // (and on every reconnect) a failure goes to the log.
    const connected = manager.isConnected();
    this.callerAwaitsStart = connected;
    this.wrapper = manager.createChannel({
      name: `nest-sequence consumer of ${this.channel}`,
      confirm: false,
      setup: async (amqp: Channel) => {
        try {
          await this.setup(amqp);
          firstSetup.resolve();
        } catch (error) {
          if (!this.callerAwaitsStart) throw error; // reported through the 'error' event
          firstSetup.reject(error);
        } finally {
          this.callerAwaitsStart = false;
        }
      },
    });
    this.wrapper.on('error', (error: Error) =>
      this.settings.logger.error(
        `subscription to ${this.channel} could not start consuming: ${error.message}; ` +
          `it tries again after the next reconnect`,
      ),
    );
    if (!connected) return;
    try {
      await started;
    } catch (error) {
      await this.close();
      throw error;
    }
  }

  /** Cancels the consumer and closes its channel; the broker requeues what was not settled. */
  close(): Promise<void> {
    this.closing ??= this.shutdown();
    return this.closing;
  }

  private async shutdown(): Promise<void> {
    this.closed = true;
    for (const timer of this.requeueTimers) clearTimeout(timer);
    this.requeueTimers.clear();
    // A dead letter already on its way gets its ack, so it is not dead-lettered twice.
    await Promise.allSettled([...this.deadLettering]);
    this.unsettled.clear();
    const consumer = this.consumer;
    if (consumer && this.openChannels.has(consumer.amqp)) {
      await consumer.amqp.cancel(consumer.consumerTag).catch(() => undefined);
    }
    await this.wrapper?.close().catch(() => undefined);
    this.settings.onClosed(this);
  }

  private async setup(amqp: Channel): Promise<void> {
    this.openChannels.add(amqp);
    amqp.once('close', () => this.openChannels.delete(amqp));
    // Without a listener, a channel closed by the broker would throw. The connection manager only
    // opens a new channel on reconnect, so consuming stops until then: worth an error in the log.
    amqp.on('error', (error: Error) => {
      if (this.callerAwaitsStart) return; // the caller of subscribe() gets this error
      this.settings.logger.error(
        `the broker closed the channel of the subscription to ${this.channel}: ` +
          `${error.message}; consuming resumes after the next reconnect`,
      );
    });
    await this.consumeOn(amqp);
  }

  private async consumeOn(amqp: Channel): Promise<void> {
    await this.settings.topology.declareOn(amqp, this.channel);
    await amqp.prefetch(this.settings.prefetch);
    const { consumerTag } = await amqp.consume(
      this.channel,
      (message) => this.receive(amqp, message),
      { noAck: false },
    );
    this.consumer = { amqp, consumerTag };
  }

  private receive(amqp: Channel, message: ConsumeMessage | null): void {
    if (message === null) {
      // The broker cancelled the consumer, e.g. because the queue was deleted: start over.
      if (this.closed || !this.openChannels.has(amqp)) return;
      this.settings.logger.warn(`the broker cancelled the consumer of ${this.channel}; resuming`);
      this.consumeOn(amqp).catch((error: Error) =>
        this.settings.logger.error(`could not resume consuming ${this.channel}: ${error.message}`),
      );
      return;
    }
    // Closing: leave it unsettled, the channel's close hands it back to the broker.
    if (this.closed) return;
    const delivery: Delivery = { amqp, message };
    this.unsettled.add(delivery);
    void this.handle(delivery);
  }

  private async handle(delivery: Delivery): Promise<void> {
    const { message } = delivery;
    const inbound: InboundMessage = {
      channel: this.channel,
      body: message.content,
      headers: { ...(message.properties.headers ?? {}) },
      redelivered: message.fields.redelivered,
    };
    let outcome: unknown;
    try {
      outcome = await this.settings.handler(inbound);
    } catch {
      outcome = undefined; // a failing handler means requeue
    }
    this.settle(delivery, toDisposition(outcome));
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
      // Held (and counted against prefetch) until the delay passes: that is the back-pressure.
      const timer = setTimeout(() => {
        this.requeueTimers.delete(timer);
        this.finish(delivery, 'requeue');
      }, delayMs);
      this.requeueTimers.add(timer);
    } else {
      const pending = this.deadLetterThenAck(delivery, disposition.reason);
      this.deadLettering.add(pending);
      void pending.finally(() => this.deadLettering.delete(pending));
    }
  }

  /** The original is acked only once its dead letter is confirmed; if that fails, it is requeued. */
  private async deadLetterThenAck(delivery: Delivery, reason: string): Promise<void> {
    const { message } = delivery;
    const headers = { ...(message.properties.headers ?? {}), [SequenceHeader.deathReason]: reason };
    try {
      await this.settings.deadLetter(this.settings.deadLetterChannel, message.content, headers);
      this.finish(delivery, 'ack');
    } catch (error) {
      this.settings.logger.warn(
        `could not dead-letter a message of ${this.channel} to ${this.settings.deadLetterChannel} ` +
          `(${reason}): ${(error as Error).message}; requeued it instead`,
      );
      this.finish(delivery, 'requeue');
    }
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
