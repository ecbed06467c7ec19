import { AsyncResource } from 'node:async_hooks';
import { randomUUID } from 'node:crypto';
import { Logger } from '@nestjs/common';
import { MAX_TIMER_MS } from '../../../core/async';
import { PartitionCountMismatchError } from '../../../core/errors/partition-count-mismatch.error';
import { PublishRejectedError } from '../../../core/errors/publish-rejected.error';
import { partitionsProblem } from '../../../core/partition';
import type { HeaderMap } from '../../../core/headers';
import {
  assertSendable,
  deadLetterHeaders,
  DEFAULT_REPLY_PREFETCH,
  headerBytes,
  defaultDeadLetterChannel,
  droppedReplyWarning,
  partitionAddressProblem,
  prefetchProblem,
  publishTimeoutMs,
  toDisposition,
  withRequeueCount,
  type InboundMessage,
  type MessageHandler,
  type PartitionAddress,
  type PublishOptions,
  type ReplyChannelOptions,
  type SubscribeOptions,
  type Subscription,
  type Transport,
} from '../../../ports/transport.port';
import type { DeadLetterBox } from '../../../ports/dead-letter-box.port';
import { InMemoryDeadLetterBox, type QueuedMessage } from './in-memory.dead-letter-box';
import { checkOptionKeys, type OptionKeysOf } from '../../../core/option-keys';
import { checkInteger } from '../../../core/option-checks';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

export interface InMemoryTransportOptions {
  /**
   * Largest message (body plus `headerBytes(headers)`) `publish` accepts.
   * @default 16777216 (16 MiB)
   */
  readonly maxMessageBytes?: number;
  /**
   * Most dead letters one dead-letter channel keeps waiting (a subscription's `deadLetterChannel`,
   * or any channel named `*.dlq`); past it the oldest are dropped, and counted
   * (`droppedDeadLetters()`, the metric `nest_sequence_transport_dead_letters_dropped`).
   * @default 10000
   */
  readonly maxDeadLetters?: number;
  /** Most bytes (bodies plus headers) one dead-letter channel keeps waiting, likewise. @default 134217728 (128 MiB) */
  readonly maxDeadLetterBytes?: number;
}

const IN_MEMORY_TRANSPORT_KEYS = {
  maxMessageBytes: true,
  maxDeadLetters: true,
  maxDeadLetterBytes: true,
} as const satisfies OptionKeysOf<InMemoryTransportOptions>;

const DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024;
const DEFAULT_MAX_DEAD_LETTERS = 10_000;
const DEFAULT_MAX_DEAD_LETTER_BYTES = 128 * 1024 * 1024;
const DEAD_LETTER_SUFFIX = '.dlq';
const DEFAULT_PREFETCH = 16;
/** Reply channels are `nseq.reply.<uuid>`: names of this prefix are theirs alone. */
const REPLY_CHANNEL_PREFIX = 'nseq.reply.';

/** The queue of partition `index` of a partitioned channel: `<channel>.partition.<index>`. */
export function inMemoryPartitionQueue(channel: string, index: number): string {
  return `${channel}.partition.${index}`;
}

/** What a subscriber's handler is told a message came from. */
interface Origin {
  readonly channel: string;
  readonly partition?: number;
}

interface Subscriber {
  /** The queue it consumes: a channel, or one partition of one. */
  readonly channel: string;
  readonly origin: Origin;
  readonly handler: MessageHandler;
  readonly prefetch: number;
  /** Undefined on a reply channel: a dead-lettered reply is dropped. */
  readonly deadLetterChannel: string | undefined;
  readonly unsettled: Set<QueuedMessage>;
  closed: boolean;
  /** Aborted when it closes: what it held unsettled went back to the channel. */
  readonly lost: AbortController;
}

interface Channel {
  readonly ready: QueuedMessage[];
  /** Bytes of `ready` (bodies plus headers). */
  bytes: number;
  readonly subscribers: Subscriber[];
  /** Where the round-robin resumes. */
  next: number;
  pumpScheduled: boolean;
  /**
   * A partition's queue: only its first subscriber gets messages (single active subscriber); the
   * next one takes over when it closes.
   */
  singleActive: boolean;
}

/**
 * The default {@link Transport}: queues in this process's memory, with the broker semantics the
 * port states (settlement by disposition, redelivery, dead-lettering, prefetch, competing
 * subscribers). Handlers always run asynchronously, never inside `publish`. Messages do not
 * survive the process.
 *
 * Requeues, as a broker does them: a plain `requeue` (or a handler that throws) puts the message
 * back at the head of its channel, so it is the next one delivered; a `requeue` with `delayMs`
 * frees the subscriber's prefetch slot at once, and after the delay puts the message at the tail
 * with `x-requeue-count` incremented. Both are redelivered with `redelivered: true`. Dead letters
 * go to `<channel>.dlq` unless the subscriber names another channel.
 *
 * Reply channels ({@link InMemoryTransport.openReplyChannel}) are channels named
 * `nseq.reply.<uuid>`, removed with whatever they hold when closed; a publish to a name of that
 * prefix that is not an open reply channel rejects with `PublishRejectedError`.
 *
 * Partitioned channels ({@link Transport.partitioned}): partition `i` of channel `c` is a queue
 * `c.partition.<i>` (what `depth`, `peek` and `take` name) beside the plain queue `c`. Its first
 * subscriber is its active one and gets all its messages; when it closes, the next subscriber in
 * subscription order takes over and gets the unsettled messages again, at the head, in their
 * order. A message may stay unsettled for as long as its subscriber lives. The first publish or
 * subscribe with a partition count fixes the channel's count for the transport's life.
 */
export class InMemoryTransport implements Transport {
  readonly name = 'in-memory';
  readonly maxMessageBytes: number;
  readonly partitioned = true;

  private readonly channels = new Map<string, Channel>();
  /** Requeue delays, each with the message it will put back. */
  private readonly delayTimers = new Map<
    NodeJS.Timeout,
    { channel: string; message: QueuedMessage }
  >();
  private readonly idleWaiters: Array<() => void> = [];
  /** Reply channels open now. */
  private readonly replyChannels = new Set<string>();
  private readonly logger = new Logger(InMemoryTransport.name);
  private closed = false;
  private readonly maxDeadLetters: number;
  private readonly maxDeadLetterBytes: number;
  /** Channels subscriptions dead-letter into (besides every `*.dlq`). */
  private readonly deadLetterTargets = new Set<string>();
  /** Each message's place in its channel, given when it is first queued (see `unsubscribe`). */
  private readonly arrival = new WeakMap<QueuedMessage, number>();
  private arrivals = 0;
  private dropped = 0;
  private deadLetterBox?: InMemoryDeadLetterBox;
  /** The partition count of each partitioned channel, fixed by its first use. */
  private readonly partitionCounts = new Map<string, number>();

  constructor(options: InMemoryTransportOptions = {}) {
    this.maxMessageBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this.maxDeadLetters = options.maxDeadLetters ?? DEFAULT_MAX_DEAD_LETTERS;
    this.maxDeadLetterBytes = options.maxDeadLetterBytes ?? DEFAULT_MAX_DEAD_LETTER_BYTES;
    const problems: string[] = [];
    checkOptionKeys(problems, options, IN_MEMORY_TRANSPORT_KEYS);
    checkInteger(problems, 'maxMessageBytes', this.maxMessageBytes, 1);
    checkInteger(problems, 'maxDeadLetters', this.maxDeadLetters, 1);
    checkInteger(problems, 'maxDeadLetterBytes', this.maxDeadLetterBytes, 1);
    if (problems.length > 0) throw new SequenceOptionsError('InMemoryTransport options', problems);
  }

  /** Dead letters dropped so far, oldest first, to keep within `maxDeadLetters` / `maxDeadLetterBytes`. */
  droppedDeadLetters(): number {
    return this.dropped;
  }

  async publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    options: PublishOptions = {},
  ): Promise<void> {
    // Enqueueing is the confirm: there is nothing to wait for, so `timeoutMs` cannot elapse. It
    // is still checked, so that a value the broker transports refuse fails here too.
    publishTimeoutMs(channel, options.timeoutMs, MAX_TIMER_MS);
    this.publishNow(channel, body, headers, options.partition);
  }

  private publishNow(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    partition?: PartitionAddress,
  ): void {
    if (this.closed) throw new Error(`in-memory transport is closed: cannot publish to ${channel}`);
    assertSendable(channel, body, headers, this.maxMessageBytes);
    if (isReplyChannel(channel) && !this.replyChannels.has(channel)) {
      const gone = new Error(`no open reply channel ${channel}`);
      throw new PublishRejectedError(channel, gone, 'its reply channel is closed');
    }
    let queue = channel;
    if (partition !== undefined) {
      assertPartitionAddress(channel, partition);
      this.claimPartitions(channel, partition.count);
      queue = inMemoryPartitionQueue(channel, partition.index);
      this.channel(queue).singleActive = true;
    }
    this.enqueue(queue, {
      body: Buffer.from(body),
      headers: { ...headers },
      redelivered: false,
      queuedAt: Date.now(),
    });
  }

  /**
   * The dead letters waiting in this transport's dead-letter channels, to browse, replay and
   * discard. Ids are numbers given on the first browse that shows a message. A dead letter that a
   * subscriber of the dead-letter channel holds unsettled is not waiting: browse does not show it.
   */
  deadLetters(): DeadLetterBox {
    this.deadLetterBox ??= new InMemoryDeadLetterBox({
      waiting: (channel) => this.channels.get(channel)?.ready ?? [],
      remove: (channel, message) => {
        const queue = this.channels.get(channel);
        const index = queue?.ready.indexOf(message) ?? -1;
        if (!queue || index < 0) return false;
        queue.ready.splice(index, 1);
        queue.bytes -= sizeOf(message);
        this.notifyIfIdle();
        return true;
      },
      publishNow: (channel, body, headers) => this.publishNow(channel, body, headers),
      deadLetterChannel: (channel) => this.deadLetterChannel(channel),
    });
    return this.deadLetterBox;
  }

  async subscribe(
    channel: string,
    handler: MessageHandler,
    options: SubscribeOptions = {},
  ): Promise<Subscription> {
    if (this.closed)
      throw new Error(`in-memory transport is closed: cannot subscribe to ${channel}`);
    const prefetch = options.prefetch ?? DEFAULT_PREFETCH;
    const deadLetterChannel = options.deadLetterChannel ?? this.deadLetterChannel(channel);
    if (options.partitions !== undefined) {
      return this.subscribePartitions(
        channel,
        handler,
        options.partitions,
        prefetch,
        deadLetterChannel,
      );
    }
    const subscriber = this.addSubscriber(channel, handler, prefetch, deadLetterChannel);
    return { channel, close: async () => this.unsubscribe(subscriber) };
  }

  /** A subscriber on each partition's queue, waiting behind the ones subscribed before it. */
  private subscribePartitions(
    channel: string,
    handler: MessageHandler,
    partitions: number,
    prefetch: number,
    deadLetterChannel: string,
  ): Subscription {
    const problem = partitionsProblem(partitions) ?? prefetchProblem(prefetch);
    if (problem) throw new RangeError(`subscribe to ${channel}: ${problem}`);
    if (isReplyChannel(channel)) {
      throw new RangeError(`subscribe to ${channel}: a reply channel has no partitions`);
    }
    this.claimPartitions(channel, partitions);
    const subscribers = Array.from({ length: partitions }, (_, index) => {
      const queue = inMemoryPartitionQueue(channel, index);
      this.channel(queue).singleActive = true;
      return this.addSubscriber(queue, handler, prefetch, deadLetterChannel, {
        channel,
        partition: index,
      });
    });
    return {
      channel,
      close: async () => subscribers.forEach((subscriber) => this.unsubscribe(subscriber)),
    };
  }

  /** Fixes `channel`'s partition count at its first use; refuses any other count after. */
  private claimPartitions(channel: string, count: number): void {
    const declared = this.partitionCounts.get(channel);
    if (declared === undefined) this.partitionCounts.set(channel, count);
    else if (declared !== count) throw new PartitionCountMismatchError(channel, count, declared);
  }

  /** Whether `channel` is one of this transport's reply channels (see the Transport port). */
  isReplyChannel(channel: string): boolean {
    return isReplyChannel(channel);
  }

  /**
   * A channel `nseq.reply.<uuid>` with this one subscriber. Closing it removes the channel and the
   * replies it holds; a dead-lettered reply is dropped with a warning.
   */
  async openReplyChannel(
    handler: MessageHandler,
    options: ReplyChannelOptions = {},
  ): Promise<Subscription> {
    if (this.closed) throw new Error('in-memory transport is closed: cannot open a reply channel');
    const channel = `${REPLY_CHANNEL_PREFIX}${randomUUID()}`;
    const prefetch = options.prefetch ?? DEFAULT_REPLY_PREFETCH;
    const subscriber = this.addSubscriber(channel, handler, prefetch, undefined);
    this.replyChannels.add(channel);
    return {
      channel,
      close: async () => {
        this.unsubscribe(subscriber);
        this.replyChannels.delete(channel);
        this.channels.delete(channel);
        this.notifyIfIdle();
      },
    };
  }

  private addSubscriber(
    channel: string,
    handler: MessageHandler,
    prefetch: number,
    deadLetterChannel: string | undefined,
    origin: Origin = { channel },
  ): Subscriber {
    const problem = prefetchProblem(prefetch);
    if (problem) throw new RangeError(problem);
    if (deadLetterChannel !== undefined) this.deadLetterTargets.add(deadLetterChannel);
    // Deliveries run in the subscriber's async context, as a broker's would: never in the
    // publisher's (whose AsyncLocalStorage state, such as an open transaction, is not theirs).
    const context = new AsyncResource('nest-sequence:in-memory-subscriber');
    const subscriber: Subscriber = {
      channel,
      origin,
      handler: (message) => context.runInAsyncScope(handler, undefined, message),
      prefetch,
      deadLetterChannel,
      unsettled: new Set(),
      closed: false,
      lost: new AbortController(),
    };
    this.channel(channel).subscribers.push(subscriber);
    this.schedulePump(channel);
    return subscriber;
  }

  deadLetterChannel(channel: string): string {
    return defaultDeadLetterChannel(channel);
  }

  async ping(): Promise<void> {
    if (this.closed) throw new Error('in-memory transport is closed');
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const channel of this.channels.values()) {
      for (const subscriber of [...channel.subscribers]) this.unsubscribe(subscriber);
    }
    // Pending delayed requeues go to the tail of their queue now, where `peek` and `take` can still
    // see them.
    for (const [timer, { channel, message }] of this.delayTimers) {
      clearTimeout(timer);
      this.append(this.channel(channel), message);
    }
    this.delayTimers.clear();
    this.notifyIfIdle();
  }

  /** Messages waiting in `channel`, not delivered to anyone. */
  depth(channel: string): number {
    return this.channels.get(channel)?.ready.length ?? 0;
  }

  /** Copies of the messages waiting in `channel`, oldest first; they stay queued. */
  peek(channel: string): InboundMessage[] {
    return (this.channels.get(channel)?.ready ?? []).map((message) =>
      inbound({ channel }, message),
    );
  }

  /** Removes and returns the messages waiting in `channel`, oldest first. */
  take(channel: string): InboundMessage[] {
    const queue = this.channels.get(channel);
    if (!queue) return [];
    queue.bytes = 0;
    return queue.ready
      .splice(0, queue.ready.length)
      .map((message) => inbound({ channel }, message));
  }

  /** Messages of `channel` delivered to a subscriber and not settled yet. */
  unsettled(channel: string): number {
    let count = 0;
    for (const subscriber of this.channels.get(channel)?.subscribers ?? []) {
      count += subscriber.unsettled.size;
    }
    return count;
  }

  /** Messages of `channel` requeued with a delay, waiting for it to pass. */
  delayed(channel: string): number {
    let count = 0;
    for (const waiting of this.delayTimers.values()) if (waiting.channel === channel) count++;
    return count;
  }

  /**
   * Resolves once nothing is left to do: no message waits in a channel that has subscribers, none
   * is in a handler, none awaits a requeue delay. Messages in channels nobody subscribes to (such
   * as dead-letter channels) do not count.
   */
  whenIdle(): Promise<void> {
    if (this.isIdle()) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  private channel(name: string): Channel {
    let channel = this.channels.get(name);
    if (!channel) {
      channel = {
        ready: [],
        bytes: 0,
        subscribers: [],
        next: 0,
        pumpScheduled: false,
        singleActive: false,
      };
      this.channels.set(name, channel);
    }
    return channel;
  }

  private enqueue(channel: string, message: QueuedMessage): void {
    // A delayed requeue that comes due after its reply channel closed: the channel is gone.
    if (isReplyChannel(channel) && !this.replyChannels.has(channel)) return;
    const queue = this.channel(channel);
    this.append(queue, message);
    if (this.deadLetterTargets.has(channel) || channel.endsWith(DEAD_LETTER_SUFFIX)) {
      this.bound(channel, queue);
    }
    this.schedulePump(channel);
  }

  private append(queue: Channel, message: QueuedMessage): void {
    if (!this.arrival.has(message)) this.arrival.set(message, ++this.arrivals);
    queue.ready.push(message);
    queue.bytes += sizeOf(message);
  }

  /** Drops a dead-letter channel's oldest waiting messages past its bounds, counting them. */
  private bound(name: string, queue: Channel): void {
    let dropped = 0;
    while (
      queue.ready.length > 0 &&
      (queue.ready.length > this.maxDeadLetters || queue.bytes > this.maxDeadLetterBytes)
    ) {
      queue.bytes -= sizeOf(queue.ready.shift()!);
      dropped += 1;
    }
    if (dropped === 0) return;
    const before = this.dropped;
    this.dropped += dropped;
    // Once, then at every thousandth: a flood of dead letters must not flood the log too.
    if (before === 0 || Math.floor(before / 1_000) !== Math.floor(this.dropped / 1_000)) {
      this.logger.warn(
        `${name}: dropped the oldest dead letter(s) to keep within maxDeadLetters ` +
          `(${this.maxDeadLetters}) and maxDeadLetterBytes (${this.maxDeadLetterBytes}); ` +
          `${this.dropped} dropped so far`,
      );
    }
  }

  /** Delivers on a later turn of the event loop: never inside `publish`, never recursively. */
  private schedulePump(name: string): void {
    const channel = this.channel(name);
    if (channel.pumpScheduled || this.closed) return;
    channel.pumpScheduled = true;
    setImmediate(() => {
      channel.pumpScheduled = false;
      this.pump(name, channel);
      this.notifyIfIdle();
    });
  }

  /** Hands waiting messages round-robin to subscribers with room under their prefetch. */
  private pump(name: string, channel: Channel): void {
    while (channel.ready.length > 0 && !this.closed) {
      const subscriber = this.nextWithRoom(channel);
      if (!subscriber) return;
      const message = channel.ready.shift()!;
      channel.bytes -= sizeOf(message);
      subscriber.unsettled.add(message);
      void Promise.resolve()
        .then(() =>
          subscriber.closed
            ? undefined
            : subscriber.handler(inbound(subscriber.origin, message, subscriber.lost.signal)),
        )
        .then(
          (disposition) => this.settle(subscriber, message, disposition),
          () => this.settle(subscriber, message, { action: 'requeue' }),
        );
    }
  }

  private nextWithRoom(channel: Channel): Subscriber | undefined {
    if (channel.singleActive) {
      const active = channel.subscribers[0];
      return active && active.unsettled.size < active.prefetch ? active : undefined;
    }
    const count = channel.subscribers.length;
    for (let offset = 0; offset < count; offset++) {
      const index = (channel.next + offset) % count;
      const subscriber = channel.subscribers[index];
      if (subscriber.unsettled.size < subscriber.prefetch) {
        channel.next = (index + 1) % count;
        return subscriber;
      }
    }
    return undefined;
  }

  private settle(subscriber: Subscriber, message: QueuedMessage, outcome: unknown): void {
    // A closed subscriber's messages were already handed back: its late verdict is ignored.
    if (subscriber.closed || !subscriber.unsettled.delete(message)) return;
    const disposition = toDisposition(outcome);
    const { deadLetterChannel } = subscriber;
    if (disposition.action === 'dead-letter') {
      if (deadLetterChannel === undefined) {
        this.logger.warn(droppedReplyWarning(subscriber.channel, disposition.reason));
      } else {
        this.enqueue(deadLetterChannel, {
          body: message.body,
          headers: deadLetterHeaders(message.headers, disposition.reason) as HeaderMap,
          redelivered: false,
          queuedAt: Date.now(),
        });
      }
    } else if (disposition.action === 'requeue') {
      this.requeue(subscriber.channel, message, disposition.delayMs ?? 0);
    }
    this.schedulePump(subscriber.channel);
    this.notifyIfIdle();
  }

  /**
   * "Try again now" goes back to the head, as a broker returns a nacked message; "retry later"
   * goes to the tail once the delay has passed, so that it cannot starve the messages behind it.
   */
  private requeue(channel: string, message: QueuedMessage, delayMs: number): void {
    if (delayMs <= 0) {
      message.redelivered = true;
      const queue = this.channel(channel);
      queue.ready.unshift(message);
      queue.bytes += sizeOf(message);
      this.schedulePump(channel);
      return;
    }
    const behind: QueuedMessage = {
      body: message.body,
      headers: withRequeueCount(message.headers),
      redelivered: true,
      queuedAt: Date.now(),
    };
    const timer = setTimeout(() => {
      this.delayTimers.delete(timer);
      this.enqueue(channel, behind);
      this.notifyIfIdle();
    }, delayMs);
    // A pending redelivery alone should not keep the process alive.
    timer.unref();
    this.delayTimers.set(timer, { channel, message: behind });
  }

  private unsubscribe(subscriber: Subscriber): void {
    if (subscriber.closed) return;
    subscriber.closed = true;
    const channel = this.channel(subscriber.channel);
    const index = channel.subscribers.indexOf(subscriber);
    if (index >= 0) channel.subscribers.splice(index, 1);
    if (channel.next >= channel.subscribers.length) channel.next = 0;
    // Handed back at the head of the queue, as a broker does for a lost consumer's messages, in
    // the order they were queued (one redelivered after a plain requeue is last in `unsettled`):
    // a partition's next active subscriber gets them in publish order.
    const place = (message: QueuedMessage) => this.arrival.get(message) ?? 0;
    const returned = [...subscriber.unsettled].sort((a, b) => place(a) - place(b));
    subscriber.unsettled.clear();
    for (const message of returned) {
      message.redelivered = true;
      channel.bytes += sizeOf(message);
    }
    channel.ready.unshift(...returned);
    subscriber.lost.abort();
    this.schedulePump(subscriber.channel);
    this.notifyIfIdle();
  }

  private isIdle(): boolean {
    if (this.delayTimers.size > 0) return false;
    for (const channel of this.channels.values()) {
      if (channel.subscribers.some((subscriber) => subscriber.unsettled.size > 0)) return false;
      if (channel.ready.length > 0 && channel.subscribers.length > 0 && !this.closed) return false;
    }
    return true;
  }

  private notifyIfIdle(): void {
    if (this.idleWaiters.length === 0 || !this.isIdle()) return;
    for (const resolve of this.idleWaiters.splice(0)) resolve();
  }
}

function isReplyChannel(channel: string): boolean {
  return channel.startsWith(REPLY_CHANNEL_PREFIX);
}

function inbound(origin: Origin, message: QueuedMessage, abandoned?: AbortSignal): InboundMessage {
  return {
    channel: origin.channel,
    body: Buffer.from(message.body),
    headers: { ...message.headers },
    redelivered: message.redelivered,
    ...(origin.partition === undefined ? {} : { partition: origin.partition }),
    ...(abandoned && { abandoned }),
  };
}

/** Throws a RangeError unless `partition` names a partition of a usable count. */
function assertPartitionAddress(channel: string, partition: PartitionAddress): void {
  const problem = partitionAddressProblem(partition);
  if (problem) throw new RangeError(`publish to ${channel}: ${problem}`);
  if (isReplyChannel(channel)) {
    throw new RangeError(`publish to ${channel}: a reply channel has no partitions`);
  }
}

function sizeOf(message: QueuedMessage): number {
  return message.body.length + headerBytes(message.headers);
}
