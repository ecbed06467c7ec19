import { setMaxListeners } from 'node:events';
import { Inject, Injectable, Logger } from '@nestjs/common';
import { settlesWithin } from '../core/async';
import { errorMessage } from '../core/errors/caught';
import type { ResolvedOptions } from '../options/resolved-options';
import {
  toDisposition,
  type Disposition,
  type InboundMessage,
  type Subscription,
  type Transport,
} from '../ports/transport.port';
import type { ChannelBinding } from './channel-binding';
import { DeadLetterMetrics } from './dead-letter.metrics';
import { RESOLVED_OPTIONS, SEQUENCE_TRANSPORT } from './tokens';

/**
 * Owns the subscriptions of every handler of the module, of all four patterns: opens them (all or
 * none: one that fails closes those opened before it, or leaves them to {@link close} at a
 * failed bootstrap) and, at shutdown, stops taking messages,
 * lets deliveries in progress finish (up to `shutdownTimeoutMs`), then closes them, so that a
 * graceful stop does not look like a crash. {@link SequenceLifecycle} drives it.
 *
 * From the start of a shutdown, a message to go back to its channel (a plain `requeue`, or a
 * handler that threw) is not settled at once: it stays unsettled until its subscription closes,
 * which hands it back. Settled at once, it could come straight back to this process, be held
 * again and be handed back once more: two deliveries spent per stop, which a transport that
 * limits deliveries (NATS JetStream's `max_deliver`) counts.
 */
@Injectable()
export class ConsumerHost {
  private readonly logger = new Logger('SequenceModule');
  private readonly subscriptions: Subscription[] = [];
  private readonly inFlight = new Set<Promise<Disposition>>();
  private readonly releases: Array<() => void> = [];
  /** Set at shutdown; resolves when deliveries in progress are done (or the wait timed out). */
  private drained: Promise<void> | undefined;
  /** Set at shutdown; resolves once the subscriptions are closed and have handed messages back. */
  private closing: Promise<void> | undefined;
  /** One for the host's life: a host is not opened again once closed. */
  private readonly stopper = stopperSignal();
  /** Set as {@link close} begins: nothing subscribes after. */
  private closeBegan = false;

  constructor(
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    private readonly deadLetters: DeadLetterMetrics,
  ) {}

  /**
   * Subscribes to every binding's channel; on a failure, closes what this call opened (unless
   * `closeOnFailure` is false: {@link close} then ends their deliveries first) and throws.
   * Called again later (a microservice's handlers, once it listens), it adds to what is open.
   * Once {@link close} began it subscribes to nothing and resolves `false`; a call that close
   * overtakes closes what it opened (close took only what was open as it began) and resolves
   * `false` too. `true` when every binding's channel is consumed.
   */
  async open(
    bindings: readonly ChannelBinding[],
    { closeOnFailure = true }: { closeOnFailure?: boolean } = {},
  ): Promise<boolean> {
    if (this.closeBegan) return false;
    this.drained = undefined;
    this.closing = undefined;
    const opened: Subscription[] = [];
    try {
      for (const binding of bindings) {
        await this.subscribe(binding, opened);
        if (this.closeBegan) break;
      }
    } catch (error) {
      // At bootstrap, left to close(), which ends the deliveries in progress first.
      if (closeOnFailure) await this.closeSubscriptions(this.takeBack(opened));
      throw error;
    }
    if (!this.closeBegan) return true;
    await this.closeSubscriptions(this.takeBack(opened));
    return false;
  }

  /** Whether a subscription of the host consumes `channel` now. */
  consumes(channel: string): boolean {
    return this.subscriptions.some((subscription) => subscription.channel === channel);
  }

  /** Those of `opened` still in the host's list, taken out of it (close took the others). */
  private takeBack(opened: readonly Subscription[]): Subscription[] {
    const taken = opened.filter((subscription) => this.subscriptions.includes(subscription));
    for (const subscription of taken) {
      this.subscriptions.splice(this.subscriptions.indexOf(subscription), 1);
    }
    return taken;
  }

  /** Subscribes to the binding's channel (and its partitions), adding each to `opened` too. */
  private async subscribe(binding: ChannelBinding, opened: Subscription[]): Promise<void> {
    const { channel, prefetch, deadLetterChannel, partitions } = binding;
    if (partitions) {
      const partitioned = await this.transport.subscribe(
        channel,
        (message) => this.track(channel, message, () => partitions.receive(message)),
        { prefetch: partitions.prefetch, deadLetterChannel, partitions: partitions.count },
      );
      this.subscriptions.push(partitioned);
      opened.push(partitioned);
      if (partitions.release) this.releases.push(partitions.release);
      this.logger.log(
        `${binding.definedBy} ${binding.describe} the ${partitions.count} partitions of ${channel} ` +
          `(${this.transport.name}, window ${partitions.prefetch} per partition)`,
      );
    }
    const subscription = await this.transport.subscribe(
      channel,
      (message) => this.track(channel, message, () => binding.receive(message)),
      { prefetch, deadLetterChannel },
    );
    this.subscriptions.push(subscription);
    opened.push(subscription);
    this.logger.log(
      `${binding.definedBy} ${binding.describe} ${channel} (${this.transport.name}, prefetch ${prefetch})`,
    );
  }

  /**
   * Aborted at shutdown once the wait for deliveries in progress is over, as the subscriptions
   * close and hand their unsettled messages back: a handler's retry must not start after that
   * (`callHandlerWithRetry`'s `stop`), since its message will be delivered again, here or
   * elsewhere, and the application's clients are closing.
   */
  get stopping(): AbortSignal {
    return this.stopper.signal;
  }

  /**
   * What stops the handler calls of `channel`'s messages: {@link stopping}, but nothing for a
   * reply channel (`Transport.isReplyChannel`). The host does not subscribe to reply channels:
   * the client that opened one reads it until it closes it, after the module's shutdown began,
   * so that a request still in flight then (a graceful service finishing its work) gets its reply.
   */
  stoppingOf(channel: string): AbortSignal | undefined {
    return this.transport.isReplyChannel?.(channel) === true ? undefined : this.stopper.signal;
  }

  /**
   * Stops taking messages, hands back what the patterns hold without handling it (their
   * `release`), waits for deliveries in progress, then closes the subscriptions.
   */
  async close(): Promise<void> {
    this.closeBegan = true;
    let closed!: () => void;
    this.closing = new Promise<void>((resolve) => (closed = resolve));
    try {
      for (const release of this.releases.splice(0)) release();
      this.drained = this.drain();
      await this.drained;
      this.stopper.abort(new Error('the module is shutting down'));
      await this.closeSubscriptions(this.subscriptions.splice(0));
    } finally {
      // Whatever failed, what is held is let go: its subscription has handed it back, or will.
      closed();
    }
  }

  /**
   * Closes the subscriptions, waiting at most `shutdownTimeoutMs` (at least
   * {@link SUBSCRIPTION_CLOSE_MIN_MS}, what a normal close may take) for the broker: one that never
   * answers (a RabbitMQ connection blocked by a resource alarm still answers heartbeats) must not
   * hold the shutdown. A subscription left closing is ended with its transport's connection.
   */
  private async closeSubscriptions(subscriptions: readonly Subscription[]): Promise<void> {
    let open = subscriptions.length;
    const closing = Promise.all(
      subscriptions.map((subscription) =>
        subscription
          .close()
          .catch((error: unknown) => {
            this.logger.warn(`closing a subscription failed: ${errorMessage(error)}`);
          })
          .finally(() => open--),
      ),
    );
    const waitMs = Math.max(this.options.shutdownTimeoutMs, SUBSCRIPTION_CLOSE_MIN_MS);
    if (!(await settlesWithin(closing, waitMs))) {
      this.logger.warn(
        `${open} subscription(s) not closed after ${waitMs} ms (shutdownTimeoutMs, at least ` +
          `${SUBSCRIPTION_CLOSE_MIN_MS}): the broker did not answer; shutdown goes on, and the ` +
          'transport closes their channels',
      );
    }
  }

  private async drain(): Promise<void> {
    if (this.inFlight.size === 0) return;
    const { shutdownTimeoutMs } = this.options;
    if (!(await settlesWithin(Promise.allSettled([...this.inFlight]), shutdownTimeoutMs))) {
      this.logger.warn(
        `${this.inFlight.size} delivery(ies) still running after shutdownTimeoutMs ` +
          `(${shutdownTimeoutMs} ms); their messages will be redelivered`,
      );
    }
  }

  private track(
    channel: string,
    message: InboundMessage,
    receive: () => Promise<Disposition>,
  ): Promise<Disposition> {
    if (this.closing) {
      // Held, not settled, until the subscriptions close: they hand unsettled messages back to
      // the queue. Settling now would redeliver it at once, in a loop, for the whole drain.
      return this.closing.then(() => SHUTTING_DOWN);
    }
    const pending = receive().then((disposition) => {
      // Every pattern's dead-letter dispositions pass here, on their way to the transport. One
      // given once the delivery was abandoned (its subscription closed, as after
      // shutdownTimeoutMs, or its consumer lost) is ignored by the transport: the message goes
      // back to its channel, and is counted if and when a later delivery is dead-lettered.
      const settled = toDisposition(disposition);
      if (settled.action === 'dead-letter' && message.abandoned?.aborted !== true) {
        this.deadLetters.deadLettered(channel, settled.reason);
      }
      return disposition;
    });
    this.inFlight.add(pending);
    // Both ways, so that a rejection (returned to the transport below) has no unhandled twin here.
    const forget = () => void this.inFlight.delete(pending);
    pending.then(forget, forget);
    // The drain waits for `pending`; a message that goes back meanwhile waits for the close.
    return pending.then(
      (disposition) => {
        if (!this.closing) return disposition;
        const settled = toDisposition(disposition);
        const goesBack = settled.action === 'requeue' && !settled.delayMs;
        return goesBack ? this.closing.then(() => disposition) : disposition;
      },
      (error: unknown) => {
        // A handler that threw: the message goes back too.
        if (this.closing) return this.closing.then(() => SHUTTING_DOWN);
        throw error;
      },
    );
  }
}

/**
 * The least time subscriptions are given to close at shutdown: a NATS subscription's close waits
 * for its pull in flight to expire, about a second or two.
 */
const SUBSCRIPTION_CLOSE_MIN_MS = 5_000;
const SHUTTING_DOWN: Disposition = { action: 'requeue', reason: 'shutting down' };

/**
 * The controller behind `stopping`: every retry waiting for its backoff listens on its signal
 * (prefetch 16 and more at once in an outage), past Node's default of 10 listeners.
 */
function stopperSignal(): AbortController {
  const controller = new AbortController();
  setMaxListeners(0, controller.signal);
  return controller;
}
