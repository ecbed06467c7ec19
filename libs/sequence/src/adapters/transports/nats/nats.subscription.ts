import type { Logger } from '@nestjs/common';
import type { Consumer, ConsumerMessages, FetchOptions, JsMsg } from '@nats-io/jetstream';
import { recycleBody } from '../body-pool';
import { Forwards } from '../forwards';
import { settlesWithin, withTimeout } from '../../../core/async';
import { errorMessage } from '../../../core/errors/caught';
import { MessageTooLargeError } from '../../../core/errors/message-too-large.error';
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
import {
  ACK,
  deliveryOf,
  forwardMsgId,
  nak,
  sendVerdict,
  term,
  WORKING,
  type NatsDelivery,
  type NatsVerdict,
} from './nats.acks';
import { describeSequence } from './nats.delivery-limit';
import { readHeaders, unreadableHeadersReason, type ReadHeaders } from './nats.headers';

export interface NatsSubscriptionSettings {
  readonly channel: string;
  readonly handler: MessageHandler;
  readonly prefetch: number;
  /** Undefined on a reply channel: a dead-lettered reply is dropped (acked) with a warning. */
  readonly deadLetterChannel: string | undefined;
  /** The consumer's `max_deliver`; undefined on a dead-letter channel (no limit). */
  readonly maxDeliver: number | undefined;
  /**
   * Whether the channel is itself a dead-letter channel: the end of the line, which nothing the
   * subscription does on its own dead-letters out of. A message whose headers cannot be read is
   * handed to the handler then. @default false
   */
  readonly endOfLine?: boolean;
  /** Delay of the `nak` for a plain requeue of a message delivered `deliveries` times. */
  readonly nakDelayMs: (deliveries: number) => number;
  /** The consumer's `ack_wait`: in-progress acks go out every third of it. */
  readonly ackWaitMs: number;
  /** The channel's durable consumer, its stream and consumer declared. */
  readonly consumer: () => Promise<Consumer>;
  /** Called when the consumer could not be fetched from: declare it again next time. */
  readonly onConsumerLost: () => void;
  /**
   * Publishes to a channel and resolves on its `PubAck`: dead letters and requeued copies. With
   * `msgId`, the `Nats-Msg-Id`: the stream stores a second publish with it (within its
   * `duplicate_window`) once.
   */
  readonly publish: (
    channel: string,
    body: Buffer,
    headers: Record<string, unknown>,
    msgId?: string,
  ) => Promise<unknown>;
  /**
   * Deletes a terminated message from the channel's stream: some servers (2.9 among them) keep a
   * terminated message in a work-queue stream, where nothing would ever remove it.
   */
  readonly removeFromStream: (streamSequence: number) => Promise<void>;
  /** Reads a message's body back from the channel's stream, for a message whose body was released. */
  readonly readFromStream: (streamSequence: number) => Promise<Buffer>;
  /** Publishes a verdict to a delivery's ack subject (see {@link NatsDelivery}). */
  readonly respond: (subject: string, payload: Uint8Array) => void;
  /**
   * Most bytes one pull request may bring, counting each message as the largest the server takes
   * (at least one message a pull), so that what the server has sent and this process not yet
   * read stays far under the server's `max_pending` for the connection (past it, the server cuts
   * the connection as a slow consumer).
   */
  readonly pullMaxBytes: number;
  /** The server's `max_payload`: the largest message a pull can bring. */
  readonly maxPayload: number;
  /** Resolves once what the connection has buffered (acks, naks) reached the server. */
  readonly flush: () => Promise<void>;
  /** A dead letter it stored on its own (`max-deliver: …`), not given as a disposition. */
  readonly onOwnDeadLetter?: (reason: string) => void;
  /** Run at close, once the unsettled messages are handed back: removes what was its alone. */
  readonly release?: () => Promise<void>;
  /**
   * Whether this subscriber may still hold messages (a partition's lease): while false, no
   * in-progress acks go out, no verdict is sent, no pull is made, and what a pull made before
   * brings is handed back unhandled (the owner of the lease stops the subscription).
   * @default always
   */
  readonly mayHold?: () => boolean;
  /**
   * Whether in-progress acks, each keeping the messages for `ackWaitMs` more, may go out now,
   * besides `mayHold` (a partition's lease: only while the messages would still come back
   * before the lease could lapse). @default always
   */
  readonly mayExtend?: (ackWaitMs: number) => boolean;
  /** The partition it reads, for a subscription with `partitions`: told on every message. */
  readonly partition?: number;
  /** How long a pull request waits for messages before the next one is made. @default 1000 */
  readonly pullExpiresMs?: number;
  readonly logger: Logger;
  readonly onClosed: (subscription: NatsSubscription) => void;
}

/**
 * The shortest `nak` delay sent. A `nak` without a delay is not counted as a delivery by some
 * servers (2.9): the message came back with `redelivered` unset and `max_deliver` never reached.
 */
const MIN_NAK_DELAY_MS = 1;

/** The body of a message whose handler released it. */
const NO_BODY = Buffer.alloc(0);
/**
 * How long a pull request waits for messages before the next one is made (the least the client
 * takes); what closing a subscription waits at most, unless its consumer has nothing to deliver
 * (see `shutdown`).
 */
const FETCH_EXPIRES_MS = 1_000;
/** How long a message whose dead letter or tail copy could not be published waits to go back. */
export const FAILED_FORWARD_PAUSE_MS = 1_000;
/** How often a subscription that may not hold messages (see `mayHold`) asks again. */
const NOT_HOLDING_CHECK_MS = 100;
/** Waits after a failed pull: doubling from the first, up to the last. */
const RETRY_FIRST_DELAY_MS = 100;
const RETRY_MAX_DELAY_MS = 5_000;

/**
 * One subscriber of a channel's durable pull consumer. It pulls at most as many messages as it
 * has free `prefetch` slots, so it never holds more than `prefetch` unsettled; subscribers of one
 * channel share the consumer and so compete for its messages. A failed pull (a lost connection,
 * a consumer deleted under it) is retried after a backoff, declaring the consumer again: that is
 * how it resumes after a reconnect or a server restart. Each pull asks for at most about
 * `pullMaxBytes`.
 *
 * Only a message's ack subject is kept for settling it; its body stays with the handler's message
 * until the handler releases it (`releaseBody`). A released message to forward without a body is
 * delivered again whole, or read back from the stream at its last allowed delivery.
 *
 * While a message is unsettled (its handler running, or a delayed requeue waiting, or a close
 * waiting to hand it back) it gets an in-progress ack every third of `ack_wait`, so the server
 * does not deliver it again meanwhile.
 *
 * - `ack`: `ack`.
 * - plain `requeue` (or a throwing handler): `nak` with a short delay growing with its deliveries;
 *   at its `max_deliver`-th delivery it is dead-lettered instead (`max-deliver: …`).
 * - `requeue` with `delayMs`: held for the delay, then a copy with `x-requeue-count` incremented
 *   is published to the channel (its tail) and the original acked.
 * - `dead-letter`: published to the dead-letter channel (headers kept, plus `x-death-reason`),
 *   then `term`, then deleted from the stream (where the server keeps terminated messages).
 *
 * On close, its unsettled messages are `nak`ed without delay, so another subscriber gets them at
 * once; verdicts that come after are ignored. A message at its `max_deliver`-th delivery, which
 * the server would never deliver again after a `nak`, is put at the tail instead (a copy with
 * `x-requeue-count` incremented, then the original acked): a stop is not a failed delivery.
 */
export class NatsSubscription implements Subscription {
  readonly channel: string;

  /** The unsettled deliveries by stream sequence: how the server tells them apart. */
  private readonly unsettled = new Map<number, NatsDelivery>();
  /** Held unhandled at their last allowed delivery while this subscriber may not hold messages. */
  private readonly keptAtLastDelivery = new Set<NatsDelivery>();
  /** What each unsettled delivery carries, to put it at the tail when handed back at close. */
  private readonly carried = new WeakMap<NatsDelivery, Carried>();
  private readonly timers = new Set<NodeJS.Timeout>();
  private readonly forwards: Forwards;
  private slotFreed?: () => void;
  private batch?: ConsumerMessages;
  private heartbeat?: NodeJS.Timeout;
  private pulling?: Promise<void>;
  private closed = false;
  private closing?: Promise<void>;
  /** Aborted as it starts closing: verdicts are ignored from then on. */
  private readonly lost = new AbortController();
  /** Set when it closed without handing its messages back: its claim on them was lost. */
  private abandoned = false;

  constructor(private readonly settings: NatsSubscriptionSettings) {
    this.channel = settings.channel;
    this.forwards = new Forwards(settings.channel, settings.logger);
  }

  /** Starts pulling (the caller has declared the consumer). */
  start(): void {
    this.heartbeat = setInterval(
      () => this.keepInProgress(),
      Math.max(100, Math.floor(this.settings.ackWaitMs / 3)),
    );
    this.pulling = this.pull();
  }

  /**
   * Sends an in-progress ack for each unsettled message while this subscriber may hold them and
   * keep them longer, and while it closes (until close has handed them back) as long as they may
   * be kept longer (a partition's lease trusted, though its owner, closing, holds no more).
   * Abandoned, or while it may not hold them, only for those kept at their last allowed delivery
   * (see notHeld): nobody else can get those. Left past `ack_wait` with a pull request waiting
   * (its own, which a close lets run out), the server would give up a message at its last
   * allowed delivery (the transport then dead-letters it) before the close hands it back as a
   * copy at the tail.
   */
  private keepInProgress(): void {
    const { mayHold, mayExtend, ackWaitMs } = this.settings;
    const all =
      !this.abandoned && (this.closed || mayHold?.() !== false) && mayExtend?.(ackWaitMs) !== false;
    const deliveries = all
      ? [...this.unsettled.values()]
      : [...this.keptAtLastDelivery].filter((delivery) => this.isHeld(delivery));
    try {
      deliveries.forEach((delivery) => sendVerdict(delivery, WORKING, this.settings.respond));
    } catch (error) {
      // Closed connection: what this subscriber holds comes again after ack_wait.
      this.settings.logger.warn(
        `could not keep the messages of ${this.channel} in progress: ${errorMessage(error)}`,
      );
    }
  }

  close(): Promise<void> {
    this.closing ??= this.shutdown(true);
    return this.closing;
  }

  /**
   * Closes without handing the unsettled messages back: for a subscriber that lost its claim on
   * them, whose `nak` could reach a message already delivered to another. The server delivers
   * them again after `ack_wait`.
   */
  abandon(): Promise<void> {
    this.closing ??= this.shutdown(false);
    return this.closing;
  }

  private async shutdown(handBack: boolean): Promise<void> {
    this.closed = true;
    this.abandoned = !handBack;
    this.lost.abort();
    for (const timer of this.timers) clearTimeout(timer);
    this.timers.clear();
    this.slotFreed?.();
    if (handBack && this.batch !== undefined && !(await this.nothingToDeliver())) {
      // No new pull is made once closed; the current one runs out (its `expires`) rather than
      // being stopped. A stopped pull loses what the server sent it before it read the stop: the
      // client unsubscribes its inbox at once and drops such a message, which the server counts
      // as delivered until `ack_wait`. What this pull brings meanwhile is held unhandled and
      // handed back with the rest. With the server away the pull does not run out: it is stopped
      // after a while (nothing reaches it then anyway).
      const pulling = this.pulling ?? Promise.resolve();
      if (!(await settlesWithin(pulling, 2 * this.pullExpiresMs))) this.batch?.stop();
    }
    // Stopped at once when abandoned (what it brings would not be handed back anyway), or when
    // the consumer had nothing to deliver: then nothing is on its way to the pull, which would
    // only hold the close until it runs out.
    this.batch?.stop();
    await this.settings.flush().catch(() => undefined);
    // The pull ends with what it had brought: held by then.
    await this.pulling;
    // A dead letter or requeued copy already on its way gets its ack, so it is not sent twice.
    await this.forwards.settled();
    // Abandoned, what it holds goes to whichever subscriber gets it again, but for what was kept
    // unhandled at its last allowed delivery (see notHeld): nobody can get that again, so it is
    // handed back all the same, as a copy at the tail.
    const handingBack = handBack
      ? [...this.unsettled.values()]
      : [...this.keptAtLastDelivery].filter((delivery) => this.isHeld(delivery));
    for (const delivery of handingBack) this.handBack(delivery);
    await this.forwards.settled();
    // Kept in progress until now (see keepInProgress): all is handed back.
    clearInterval(this.heartbeat);
    this.keptAtLastDelivery.clear();
    this.unsettled.clear();
    await this.settings.flush().catch(() => undefined);
    await this.settings
      .release?.()
      .catch((error: unknown) =>
        this.settings.logger.warn(`closing ${this.channel}: ${errorMessage(error)}`),
      );
    this.settings.onClosed(this);
  }

  private get pullExpiresMs(): number {
    return this.settings.pullExpiresMs ?? FETCH_EXPIRES_MS;
  }

  /**
   * Whether the consumer has no message to deliver, to this pull or another: none pending and
   * none unacknowledged (a held one comes due once naked, this subscriber's own included). False
   * when the server does not answer within a pull's `expires`.
   */
  private async nothingToDeliver(): Promise<boolean> {
    const asked = (async () => {
      const info = await (await this.settings.consumer()).info(false);
      return info.num_pending === 0 && info.num_ack_pending === 0;
    })();
    return withTimeout(asked, this.pullExpiresMs, () => new Error('no answer')).catch(() => false);
  }

  private async pull(): Promise<void> {
    let failures = 0;
    while (!this.closed) {
      const free = this.settings.prefetch - this.unsettled.size;
      if (free <= 0) {
        await new Promise<void>((resolve) => (this.slotFreed = resolve));
        this.slotFreed = undefined;
        continue;
      }
      if (this.settings.mayHold?.() === false) {
        // Nothing is pulled that could not be handled: woken early by close.
        await new Promise<void>((resolve) => {
          this.slotFreed = resolve;
          setTimeout(resolve, NOT_HOLDING_CHECK_MS).unref();
        });
        this.slotFreed = undefined;
        continue;
      }
      try {
        const consumer = await this.settings.consumer();
        if (this.closed) return;
        const batch = await consumer.fetch(this.pullOptions(free));
        this.batch = batch;
        // Abandoned meanwhile: stopped (what it brings would not be handed back anyway).
        if (this.closed && this.abandoned) batch.stop();
        for await (const message of batch) {
          if (this.closed) {
            // Pulled as the subscription closes: kept unhandled, and settled with the others at
            // close. (A nak now would bring it straight back to this pull request, again and
            // again.)
            this.hold(deliveryOf(message), {
              headers: headersOf(message).headers,
              body: undefined,
            });
          } else if (this.settings.mayHold?.() === false) {
            this.notHeld(message);
          } else {
            this.receive(message);
          }
        }
        failures = 0;
      } catch (error) {
        if (this.closed) return;
        const waitMs = Math.min(RETRY_FIRST_DELAY_MS * 2 ** failures, RETRY_MAX_DELAY_MS);
        failures++;
        this.settings.onConsumerLost();
        this.settings.logger.warn(
          `pulling from ${this.channel} failed: ${errorMessage(error)}; trying again in ${waitMs} ms`,
        );
        // Woken early by close.
        await new Promise<void>((resolve) => {
          this.slotFreed = resolve;
          setTimeout(resolve, waitMs).unref();
        });
        this.slotFreed = undefined;
      }
    }
  }

  /**
   * A pull of at most `free` messages and at most `pullMaxBytes`: as many of the largest
   * messages as fit, at least one. (A byte-bounded pull of the client's asks for 100 messages
   * whatever the free slots, and ends in an error when they come before the bytes run out.)
   */
  private pullOptions(free: number): FetchOptions {
    const { pullMaxBytes, maxPayload } = this.settings;
    const fit = Math.max(1, Math.floor(pullMaxBytes / maxPayload));
    return { max_messages: Math.min(free, fit), expires: this.pullExpiresMs };
  }

  /**
   * Hands the message to the handler. From here on only its {@link NatsDelivery} is kept for
   * settling, and the body only as long as the handler's message holds it (`releaseBody`).
   */
  private receive(message: JsMsg): void {
    const delivery = deliveryOf(message);
    const { problem, ...read } = headersOf(message);
    // In a dead-letter channel it goes to the handler, with the reason the console lists it by.
    const unreadable = problem === undefined ? undefined : unreadableHeadersReason(problem);
    const headers =
      unreadable !== undefined && this.settings.endOfLine
        ? { [SequenceHeader.deathReason]: unreadable }
        : read.headers;
    const data = message.data;
    let released = false;
    const inbound: { -readonly [K in keyof InboundMessage]: InboundMessage[K] } = {
      channel: this.channel,
      body: Buffer.from(data.buffer, data.byteOffset, data.byteLength),
      headers,
      // A copy put at the tail by a delayed requeue is a new message to the server.
      redelivered: message.redelivered || requeueCount(headers) > 0,
      ...(this.settings.partition === undefined ? {} : { partition: this.settings.partition }),
      abandoned: this.lost.signal,
    };
    // The message itself is kept for settling where its ack subject is not known: no release.
    if (delivery.message === undefined) {
      inbound.releaseBody = () => {
        // Once: its memory may hold a later message's body by the next call.
        if (released) return;
        released = true;
        const body = inbound.body;
        inbound.body = NO_BODY;
        // With unsafeSocketTricks, a large payload goes back to the connection for the next one.
        // (Read from the message, not kept in this closure: that would hold every held body.)
        recycleBody(body);
      };
    }
    // The headers, and the body while the handler's message holds it.
    this.hold(delivery, {
      headers,
      get body() {
        return released ? undefined : inbound.body;
      },
    });
    if (unreadable !== undefined && !this.settings.endOfLine) {
      // Nothing could tell the handler what the message is: dead-lettered, without its headers.
      this.settle(delivery, inbound, false, { action: 'dead-letter', reason: unreadable });
      return;
    }
    void this.handle(delivery, inbound, () => released);
  }

  private async handle(
    delivery: NatsDelivery,
    inbound: InboundMessage,
    released: () => boolean,
  ): Promise<void> {
    let outcome: unknown;
    try {
      outcome = await this.settings.handler(inbound);
    } catch {
      outcome = undefined; // a failing handler means requeue
    }
    this.settle(delivery, inbound, released(), toDisposition(outcome));
  }

  private settle(
    delivery: NatsDelivery,
    inbound: InboundMessage,
    released: boolean,
    disposition: Disposition,
  ): void {
    // After close, the message went back to the consumer: a late verdict changes nothing.
    if (this.closed || !this.isHeld(delivery)) {
      if (this.abandoned) this.ignored(delivery, disposition);
      return;
    }
    // Its claim lapsed (a partition's lease): another may hold the message by now, so it is left
    // for the server to deliver again rather than settled from here.
    if (this.settings.mayHold?.() === false) {
      this.ignored(delivery, disposition);
      return;
    }
    const given = disposition.action === 'ack' ? undefined : disposition.body;
    const deliveries = delivery.deliveryCount;
    const { maxDeliver } = this.settings;
    const lastDelivery = maxDeliver !== undefined && deliveries >= maxDeliver;
    const forwarding =
      disposition.action === 'dead-letter' ||
      (disposition.action === 'requeue' && (disposition.delayMs ?? 0) > 0);
    if (forwarding && released && given === undefined && !lastDelivery) {
      // As on other transports: the server delivers it again whole, for the handler to decide.
      this.settings.logger.warn(
        `a message of ${this.channel} was to be ${disposition.action === 'dead-letter' ? 'dead-lettered' : 'requeued behind the queued ones'} ` +
          'after its handler released its body, without the body: delivered again instead',
      );
      this.finish(delivery, this.plainRequeue(deliveries));
      return;
    }
    // The body to forward: the handler's, else the message's, else (at its last delivery, when
    // it could not come again) read back from the stream.
    const body = (): Promise<Buffer> =>
      given
        ? Promise.resolve(given)
        : released
          ? this.settings.readFromStream(delivery.streamSequence)
          : Promise.resolve(inbound.body);
    if (disposition.action === 'ack') {
      this.finish(delivery, ACK);
    } else if (disposition.action === 'dead-letter') {
      this.forwards.add(this.deadLetter(delivery, inbound, body, disposition.reason));
    } else if ((disposition.delayMs ?? 0) > 0) {
      // Held (and counted against prefetch) until the delay passes: that is the back-pressure.
      // A claim that lapsed meanwhile (before its owner stopped the subscription) leaves it to
      // the server, as above: a copy at the tail would come to the next holder besides the
      // original, which the server delivers again.
      this.holdFor(disposition.delayMs!, () => {
        if (this.settings.mayHold?.() === false) {
          this.ignored(delivery, disposition, 'its delay ended');
          return;
        }
        this.forwards.add(this.requeueAtTail(delivery, inbound, body));
      });
    } else {
      if (lastDelivery) {
        const reason =
          `max-deliver: delivered ${deliveries} times (the consumer's max_deliver) and requeued ` +
          `each time${disposition.reason ? ` (${disposition.reason})` : ''}`;
        this.forwards.add(this.deadLetter(delivery, inbound, body, reason, true));
        return;
      }
      this.finish(delivery, this.plainRequeue(deliveries));
    }
  }

  /**
   * Logs a verdict given (or a delayed requeue's delay ended) after this subscriber lost its claim
   * on the message (a partition's lease no longer trusted): it is not sent, and the server
   * delivers the message again after `ack_wait`, to whoever holds the partition then.
   */
  private ignored(
    delivery: NatsDelivery,
    disposition: Disposition,
    /** What came after the loss: the verdict, or the end of a delayed requeue's delay. */
    came: 'given' | 'its delay ended' = 'given',
  ): void {
    const where =
      this.settings.partition === undefined ? '' : ` partition ${this.settings.partition}`;
    const why = disposition.action === 'ack' ? '' : ` (${disposition.reason ?? 'no reason'})`;
    this.settings.logger.warn(
      `${disposition.action} verdict on message ${delivery.streamSequence} of ${this.channel}` +
        `${where}${why} ignored: ${came} after this subscriber's lease on it was lost; the server ` +
        `delivers it again after ack_wait (${this.settings.ackWaitMs} ms) to the lease's holder`,
    );
  }

  /** The original is terminated only once its dead letter is stored; if that fails, it is requeued. */
  private async deadLetter(
    delivery: NatsDelivery,
    inbound: InboundMessage,
    body: () => Promise<Buffer>,
    reason: string,
    own = false,
  ): Promise<void> {
    const { deadLetterChannel } = this.settings;
    if (deadLetterChannel === undefined) {
      // Acked rather than terminated: servers 2.9 keep a terminated message in the stream.
      this.settings.logger.warn(droppedReplyWarning(this.channel, reason));
      this.finish(delivery, ACK);
      return;
    }
    try {
      const headers = forwardableHeaders(deadLetterHeaders(inbound.headers, reason), [
        SequenceHeader.deathReason,
      ]);
      // One dead letter per stored message: should the term be lost, the message's next delivery
      // dead-lettered again within the dead-letter stream's duplicate_window is stored once.
      await this.settings.publish(
        deadLetterChannel,
        await body(),
        headers,
        forwardMsgId('dead-letter', delivery.stored),
      );
      this.finish(delivery, term(reason.slice(0, 200)));
      if (own) this.settings.onOwnDeadLetter?.(reason);
      await this.settings
        .removeFromStream(delivery.streamSequence)
        .catch((error: unknown) =>
          this.settings.logger.warn(
            `could not delete a dead-lettered message of ${this.channel} from its stream: ` +
              `${errorMessage(error)}`,
          ),
        );
    } catch (error) {
      const problem =
        `could not dead-letter message ${delivery.streamSequence} of ${this.channel}` +
        `${describeSequence(inbound.headers)} to ${deadLetterChannel} (${reason}): ` +
        errorMessage(error);
      if (error instanceof MessageTooLargeError) {
        // Its body alone leaves no room for the dead letter's headers: no retry helps. Past
        // max_deliver it stays in the channel's stream, at this sequence, for an operator (the
        // MAX_DELIVERIES advisory's watch reports it once more then).
        const { maxDeliver } = this.settings;
        this.settings.logger.error(
          `${problem}; its body leaves no room for the dead letter's headers: ` +
            (maxDeliver !== undefined && delivery.deliveryCount >= maxDeliver
              ? `delivery ${delivery.deliveryCount} was its last (max_deliver ${maxDeliver})`
              : `delivered again until its max_deliver-th delivery (this was ` +
                `${delivery.deliveryCount} of ${maxDeliver ?? 'unlimited'})`) +
            `, then it stays in the stream at sequence ${delivery.streamSequence}`,
        );
      } else {
        this.settings.logger.warn(`${problem}; requeuing it in ${FAILED_FORWARD_PAUSE_MS} ms`);
      }
      this.finish(delivery, nak(FAILED_FORWARD_PAUSE_MS));
    }
  }

  /** The original is acked only once its copy at the tail is stored; if that fails, it is naked. */
  private async requeueAtTail(
    delivery: NatsDelivery,
    inbound: InboundMessage,
    body: () => Promise<Buffer>,
  ): Promise<void> {
    try {
      const headers = forwardableHeaders(withRequeueCount(inbound.headers), [REQUEUE_COUNT_HEADER]);
      // One copy per stored message: should the ack be lost, the original's next delivery
      // requeued again within the stream's duplicate_window is stored once.
      await this.settings.publish(
        this.channel,
        await body(),
        headers,
        forwardMsgId('requeue', delivery.stored),
      );
      this.finish(delivery, ACK);
    } catch (error) {
      this.settings.logger.warn(
        `could not requeue a message of ${this.channel} behind the queued ones: ` +
          `${errorMessage(error)}; naking it for ${FAILED_FORWARD_PAUSE_MS} ms instead`,
      );
      this.finish(delivery, nak(FAILED_FORWARD_PAUSE_MS));
    }
  }

  /** Runs `then` after `ms`, unless the subscription closes first (its timers are cleared). */
  private holdFor(ms: number, then: () => void): void {
    const timer = setTimeout(() => {
      this.timers.delete(timer);
      then();
    }, ms);
    this.timers.add(timer);
  }

  /** A plain requeue's `nak`: delayed more with each delivery. */
  private plainRequeue(deliveries: number): NatsVerdict {
    return nak(Math.max(MIN_NAK_DELAY_MS, this.settings.nakDelayMs(deliveries)));
  }

  /** Sends a verdict; on a closed connection the server delivers the message again after ack_wait. */
  private respond(delivery: NatsDelivery, verdict: NatsVerdict): void {
    try {
      sendVerdict(delivery, verdict, this.settings.respond);
    } catch (error) {
      this.settings.logger.warn(
        `could not settle a message of ${this.channel}: ${errorMessage(error)}`,
      );
    }
  }

  /**
   * Counts a delivery as unsettled. The server knows a message by its stream sequence only, so a
   * verdict on an earlier delivery of the same message (delivered again after a lost connection,
   * say) would settle this one too: the earlier one is forgotten, and its verdict ignored.
   */
  private hold(delivery: NatsDelivery, carried: Carried): void {
    this.unsettled.set(delivery.streamSequence, delivery);
    this.carried.set(delivery, carried);
  }

  /**
   * A message pulled while this subscriber may not hold messages (its partition's claim lapsed,
   * or its owner is closing): handed back unhandled, not kept (in-progress acks would keep it so
   * for good were the claim trusted again). A `nak` delayed past the pull request that brought
   * it, the last one made until then; at its last allowed delivery, where a `nak` would end it
   * unhandled, it is kept instead for the stop that follows, which hands it back as a copy at
   * the tail (see handBack), also when it abandons the rest.
   */
  private notHeld(message: JsMsg): void {
    const delivery = deliveryOf(message);
    const { maxDeliver } = this.settings;
    if (maxDeliver !== undefined && delivery.deliveryCount >= maxDeliver) {
      this.hold(delivery, { headers: headersOf(message).headers, body: undefined });
      this.keptAtLastDelivery.add(delivery);
      return;
    }
    this.respond(delivery, nak(this.pullExpiresMs));
  }

  /**
   * Hands an unsettled message back as the subscription closes: a `nak` without delay, or, at
   * its last allowed delivery, a copy at the tail (its body read back from the stream when it is
   * not at hand) and the original acked.
   */
  private handBack(delivery: NatsDelivery): void {
    const { maxDeliver } = this.settings;
    const carried = this.carried.get(delivery);
    if (maxDeliver === undefined || delivery.deliveryCount < maxDeliver || !carried) {
      this.finish(delivery, nak(MIN_NAK_DELAY_MS));
      return;
    }
    const { body } = carried;
    const inbound: InboundMessage = {
      channel: this.channel,
      body: body ?? NO_BODY,
      headers: carried.headers,
      redelivered: true,
    };
    this.forwards.add(
      this.requeueAtTail(delivery, inbound, () =>
        body ? Promise.resolve(body) : this.settings.readFromStream(delivery.streamSequence),
      ),
    );
  }

  /** Whether `delivery` is unsettled, and not replaced by a newer delivery of its message. */
  private isHeld(delivery: NatsDelivery): boolean {
    return this.unsettled.get(delivery.streamSequence) === delivery;
  }

  /** Settles `delivery` once (unless close handed it back already) and frees its slot. */
  private finish(delivery: NatsDelivery, verdict: NatsVerdict): void {
    if (!this.isHeld(delivery)) return;
    this.unsettled.delete(delivery.streamSequence);
    this.respond(delivery, verdict);
    this.slotFreed?.();
  }
}

/**
 * What an unsettled delivery carries: its headers, and its body while the handler's message holds
 * it (undefined once released, and for a message held unhandled: read back from the stream).
 */
interface Carried {
  readonly headers: Record<string, unknown>;
  readonly body: Buffer | undefined;
}

function headersOf(message: JsMsg): ReadHeaders {
  // Typed `MsgHdrs` (an iterable of [name, values]) in a declaration TypeScript cannot resolve.
  return readHeaders(() => message.headers as Iterable<[string, string[]]> | undefined);
}
