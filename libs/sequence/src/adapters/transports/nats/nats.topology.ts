import {
  AckPolicy,
  DeliverPolicy,
  DiscardPolicy,
  JetStreamApiError,
  RetentionPolicy,
  StorageType,
  type ConsumerConfig,
  type ConsumerInfo,
  type JetStreamManager,
  type StreamConfig,
  type StreamInfo,
} from '@nats-io/jetstream';
import type { Logger } from '@nestjs/common';
import { nanos } from './nats.client';
import { MAX_TIMER_MS } from '../../../core/async';
import { errorMessage } from '../../../core/errors/caught';
import { PartitionCountMismatchError } from '../../../core/errors/partition-count-mismatch.error';
import { NatsTopologyError } from './errors/nats-topology.error';
import {
  isReplyChannel,
  LEASE_SUBJECT_PREFIX,
  leaseStreamName,
  partitionConsumerName,
  partitionStreamName,
  partitionSubject,
  REPLY_SUBJECT_PREFIX,
  replyStreamName,
  streamName,
  subjectProblem,
} from './nats.naming';
import { MIN_PARTITION_LEASE_MS, type ResolvedNatsTransportOptions } from './nats.options';

/** Channel names the partition leases use: `nseq-lease.` and `nseq-lease-free.`. */
const RESERVED_LEASE_PREFIX = 'nseq-lease';

/** JetStream API error codes the topology handles. */
const STREAM_NOT_FOUND = 10059;
const CONSUMER_NOT_FOUND = 10014;
/**
 * JetStream API errors that say nothing of the stream or consumer asked about: a cluster that has
 * no leader just then ("JetStream system temporarily unavailable", while it elects one after a
 * node restarts) or whose node cannot answer it ("JetStream cluster can not handle request").
 */
const PASSING_API_ERRORS: ReadonlySet<number> = new Set([10008, 10009]);

/** The reply stream's subjects; also its key among the declarations (no channel can be it). */
const REPLY_SUBJECTS = `${REPLY_SUBJECT_PREFIX}>`;
/**
 * A reply channel's consumer is removed by the server after this long without a pull request:
 * what is left of a process that ended without closing. A subscription pulls continuously
 * (each request lasts 5 s), and one holding unacked messages is not counted inactive.
 */
export const REPLY_INACTIVE_THRESHOLD_MS = 60_000;

/**
 * `ack_wait` of a partition's consumer: at most half the lease, so that a holder renewing its
 * lease every quarter of it can keep its messages in progress and still stop early enough that,
 * lost, its messages come back before its lease lapses (see NatsPartitionedSubscription).
 */
export function partitionAckWaitMs(ackWaitMs: number, leaseMs: number): number {
  return Math.min(ackWaitMs, Math.floor(leaseMs / 2));
}

/**
 * The JetStream objects behind a channel, declared idempotently: a stream `streamName(channel)`
 * on the one subject `<channel>` (file storage, work-queue retention: a message leaves the stream
 * once acked or terminated), and on it a durable pull consumer with explicit acks, `ack_wait` and
 * `max_deliver`. A channel's dead-letter channel `<channel><suffix>` gets the same, declared with
 * the channel; a dead-letter channel gets no dead-letter channel of its own, and its consumer no
 * `max_deliver`. An existing stream is used as it is (only its subject is checked); an existing
 * consumer whose `ack_wait` or `max_deliver` differ is updated, and one the transport cannot use
 * (see {@link consumerProblem}) is refused with {@link NatsTopologyError}.
 *
 * Reply channels (subjects `nseq-reply.<uuid>`) share one stream, `<streamPrefix>_REPLY` on
 * `nseq-reply.>`, with interest retention (a reply is kept only while a consumer is interested
 * and has not acked it), `max_age` and `max_bytes` (`discard: old`); each has a consumer of its
 * own filtered on its subject, removed at close or, when nobody closes it, by the server after
 * {@link REPLY_INACTIVE_THRESHOLD_MS} without a pull.
 *
 * A partitioned channel split `count` ways has a work-queue stream of its own,
 * `<stream>_PARTITIONS`, on exactly the subjects `<channel>.partition.0` to `.<count-1>`: the
 * count is part of the stream, and a declaration with another count is refused with
 * `PartitionCountMismatchError`, whichever side declared first. Its subscribers add a durable
 * pull consumer per partition (filtered on the partition's subject, `ack_wait` at most the lease
 * time) and the lease stream `<stream>_LEASES` on `nseq-lease.<channel>.*` (one message per
 * subject, `max_age` the lease time). Its dead letters go to the channel's dead-letter channel.
 */
export class NatsTopology {
  private readonly declared = new Map<string, Promise<void>>();
  /** Per partitioned channel, its partition stream's count once declared. */
  private readonly partitionStreams = new Map<string, Promise<number>>();
  /** Per partitioned channel, its consumers and lease stream: resolves to the lease time. */
  private readonly partitionSubscriptions = new Map<string, Promise<number>>();
  /**
   * Per stream, its repair under way (see `repairRolledBack`): kept apart from the declarations,
   * which a failed pull forgets while the repair that made it fail still runs.
   */
  private readonly repairs = new Map<string, Promise<void>>();
  /** Per stream, its `duplicate_window` in ms as the server reported it at its declaration. */
  private readonly duplicateWindows = new Map<string, number>();

  constructor(
    private readonly settings: ResolvedNatsTransportOptions,
    private readonly manager: () => Promise<JetStreamManager>,
    private readonly logger: Logger,
  ) {}

  deadLetterChannel(channel: string): string {
    return `${channel}${this.settings.deadLetterSuffix}`;
  }

  isDeadLetterChannel(channel: string): boolean {
    return channel.endsWith(this.settings.deadLetterSuffix);
  }

  stream(channel: string): string {
    if (isReplyChannel(channel)) return replyStreamName(this.settings.streamPrefix);
    return streamName(this.settings.streamPrefix, channel);
  }

  /** Throws {@link NatsTopologyError} for a channel that cannot be a subject. */
  assertChannel(channel: string): void {
    const problem = subjectProblem(channel);
    if (problem) {
      throw new NatsTopologyError(channel, this.stream(channel), `the channel name ${problem}`);
    }
  }

  /** Declares `channel`'s stream and consumer (and its dead-letter channel's), once. */
  ensure(channel: string): Promise<void> {
    // A reply channel is published to through the one reply stream; its consumer is its owner's.
    const key = isReplyChannel(channel) ? REPLY_SUBJECTS : channel;
    let pending = this.declared.get(key);
    if (!pending) {
      pending = key === REPLY_SUBJECTS ? this.declareReplyStream(channel) : this.declare(channel);
      this.declared.set(key, pending);
      pending.catch(() => {
        if (this.declared.get(key) === pending) this.declared.delete(key);
      });
    }
    return pending;
  }

  /**
   * The `duplicate_window` of `stream`, in ms, as the server reported it when the stream was last
   * declared (made, or found made by someone else); undefined before.
   */
  duplicateWindowMs(stream: string): number | undefined {
    return this.duplicateWindows.get(stream);
  }

  /** Keeps the `duplicate_window` a stream's info tells. */
  private noteWindow(name: string, info: StreamInfo | undefined): void {
    const window = info?.config.duplicate_window;
    if (typeof window === 'number' && window > 0) {
      this.duplicateWindows.set(name, Math.floor(window / 1_000_000));
    }
  }

  /** Forgets what was declared: after a reconnect, or when a stream turned out to be gone. */
  forget(channel?: string): void {
    if (channel === undefined) {
      this.declared.clear();
      this.partitionStreams.clear();
      this.partitionSubscriptions.clear();
    } else {
      this.declared.delete(isReplyChannel(channel) ? REPLY_SUBJECTS : channel);
    }
  }

  /** Forgets a partitioned channel's declarations: declared again on next use. */
  forgetPartitions(channel: string): void {
    this.partitionStreams.delete(channel);
    this.partitionSubscriptions.delete(channel);
  }

  partitionStream(channel: string): string {
    return partitionStreamName(this.settings.streamPrefix, channel);
  }

  leaseStream(channel: string): string {
    return leaseStreamName(this.settings.streamPrefix, channel);
  }

  /** Throws {@link NatsTopologyError} for a channel that cannot be partitioned. */
  assertPartitionable(channel: string): void {
    this.assertChannel(channel);
    if (isReplyChannel(channel) || channel.startsWith(RESERVED_LEASE_PREFIX)) {
      const why = `channels under ${REPLY_SUBJECT_PREFIX} and ${RESERVED_LEASE_PREFIX} are reserved`;
      throw new NatsTopologyError(channel, this.partitionStream(channel), why);
    }
  }

  /**
   * Declares a partitioned channel's partition stream with `count` partitions, and its
   * dead-letter channel, once. Rejects with {@link PartitionCountMismatchError} when the stream
   * exists with another count.
   */
  async ensurePartitions(channel: string, count: number): Promise<void> {
    let pending = this.partitionStreams.get(channel);
    if (!pending) {
      pending = this.declarePartitionStream(channel, count);
      this.partitionStreams.set(channel, pending);
      const declared = pending;
      declared.catch(() => {
        if (this.partitionStreams.get(channel) === declared) this.partitionStreams.delete(channel);
      });
    }
    const declared = await pending;
    if (declared !== count) throw new PartitionCountMismatchError(channel, count, declared);
  }

  /**
   * What a subscriber of a partitioned channel needs besides {@link ensurePartitions}: a durable
   * consumer per partition and the lease stream. Resolves to the lease time (the lease stream's
   * `max_age`).
   */
  async ensurePartitionSubscription(channel: string, count: number): Promise<number> {
    await this.ensurePartitions(channel, count);
    let pending = this.partitionSubscriptions.get(channel);
    if (!pending) {
      pending = this.declarePartitionSubscription(channel, count);
      this.partitionSubscriptions.set(channel, pending);
      const declared = pending;
      declared.catch(() => {
        if (this.partitionSubscriptions.get(channel) === declared) {
          this.partitionSubscriptions.delete(channel);
        }
      });
    }
    return pending;
  }

  /** The count a partition stream's subjects tell, or a topology error when they are not ours. */
  private partitionCount(channel: string, name: string, subjects: readonly string[]): number {
    const ours = subjects.every((subject, index) => subject === partitionSubject(channel, index));
    if (!ours || subjects.length === 0) {
      throw new NatsTopologyError(
        channel,
        name,
        `the stream exists with subjects ${JSON.stringify(subjects)}, not ` +
          `${partitionSubject(channel, 0)} and the following partitions; delete it or choose ` +
          `another streamPrefix`,
      );
    }
    return subjects.length;
  }

  private async declarePartitionStream(channel: string, count: number): Promise<number> {
    this.assertPartitionable(channel);
    await this.ensure(this.deadLetterChannel(channel));
    const jsm = await this.manager();
    const name = this.partitionStream(channel);
    const existing = async () => {
      const info = await jsm.streams.info(name);
      const found = this.partitionCount(channel, name, info.config.subjects ?? []);
      this.noteWindow(name, info);
      return found;
    };
    let found: number | undefined;
    try {
      found = await existing();
    } catch (error) {
      if (!isApiError(error, STREAM_NOT_FOUND)) throw this.refused(channel, name, error);
    }
    if (found !== undefined) {
      // Its errors are passing ones (the server just back), retried with the declaration.
      await this.repairRolledBack(jsm, channel, name);
      return found;
    }
    const subjects = Array.from({ length: count }, (_, index) => partitionSubject(channel, index));
    try {
      const made = await jsm.streams.add({
        name,
        subjects,
        description: `nest-sequence: channel ${channel} in ${count} partitions`,
        retention: RetentionPolicy.Workqueue,
        storage: StorageType.File,
        duplicate_window: nanos(this.settings.duplicateWindowMs),
      });
      this.noteWindow(name, made);
      return count;
    } catch (error) {
      // Declared by another instance meanwhile, perhaps with another count.
      return existing().catch(() => {
        throw this.refused(channel, name, error);
      });
    }
  }

  private async declarePartitionSubscription(channel: string, count: number): Promise<number> {
    const jsm = await this.manager();
    const leaseMs = await this.declareLeaseStream(jsm, channel);
    const stream = this.partitionStream(channel);
    for (let index = 0; index < count; index++) {
      await this.declareConsumer(jsm, channel, stream, {
        durable: partitionConsumerName(this.settings.durableName, index),
        filterSubject: partitionSubject(channel, index),
        ackWaitMs: partitionAckWaitMs(this.settings.ackWaitMs, leaseMs),
        maxDeliver: this.settings.maxDeliver,
      });
    }
    return leaseMs;
  }

  /** Declares the channel's lease stream; resolves to its `max_age`, the lease time. */
  private async declareLeaseStream(jsm: JetStreamManager, channel: string): Promise<number> {
    const name = this.leaseStream(channel);
    const subject = `${LEASE_SUBJECT_PREFIX}${channel}.*`;
    const leaseMs = this.settings.partitionLeaseMs;
    await this.declareStream(jsm, channel, subject, {
      name,
      retention: RetentionPolicy.Limits,
      storage: StorageType.File,
      max_msgs_per_subject: 1,
      max_age: nanos(leaseMs),
      discard: DiscardPolicy.Old,
      duplicate_window: nanos(Math.min(leaseMs, this.settings.duplicateWindowMs)),
    });
    const info = await jsm.streams.info(name).catch((error: unknown) => {
      throw this.refused(channel, name, error);
    });
    const maxAgeMs = Math.floor((info.config.max_age ?? 0) / 1_000_000);
    if (
      maxAgeMs < MIN_PARTITION_LEASE_MS ||
      maxAgeMs > MAX_TIMER_MS ||
      info.config.max_msgs_per_subject !== 1
    ) {
      // Past a Node timer's longest, the lease's timers would fire at once, again and again.
      throw new NatsTopologyError(
        channel,
        name,
        `a lease stream needs max_msgs_per_subject 1 and a max_age from ${MIN_PARTITION_LEASE_MS} ` +
          `to ${MAX_TIMER_MS} ms, got ${maxAgeMs} ms; delete it and let the transport declare it`,
      );
    }
    return maxAgeMs;
  }

  /**
   * Declares the reply stream and, on it, the consumer `consumer` of the reply channel `channel`
   * (idempotent: after a reconnect, or when the server removed it, it is made again).
   */
  async ensureReplyConsumer(channel: string, consumer: string, maxDeliver: number): Promise<void> {
    await this.ensure(channel);
    const jsm = await this.manager();
    const stream = this.stream(channel);
    const found = await jsm.consumers.info(stream, consumer).catch((error: unknown) => {
      if (isApiError(error, CONSUMER_NOT_FOUND)) return undefined;
      throw this.refused(channel, stream, error);
    });
    if (found) return;
    await jsm.consumers
      .add(stream, {
        name: consumer,
        filter_subject: channel,
        ack_policy: AckPolicy.Explicit,
        // The channel is new: nothing was published to it before.
        deliver_policy: DeliverPolicy.New,
        ack_wait: nanos(this.settings.ackWaitMs),
        max_deliver: maxDeliver,
        max_ack_pending: -1,
        inactive_threshold: nanos(REPLY_INACTIVE_THRESHOLD_MS),
      })
      .catch((error: unknown) => {
        throw this.refused(channel, stream, error);
      });
  }

  /** Deletes a reply channel's consumer: the server then keeps nothing more for its subject. */
  async deleteReplyConsumer(channel: string, consumer: string): Promise<void> {
    const jsm = await this.manager();
    await jsm.consumers.delete(this.stream(channel), consumer).catch((error: unknown) => {
      if (!isApiError(error, CONSUMER_NOT_FOUND)) throw error;
    });
  }

  private async declareReplyStream(channel: string): Promise<void> {
    const { replyMaxAgeMs, replyMaxBytes, duplicateWindowMs } = this.settings;
    await this.declareStream(await this.manager(), channel, REPLY_SUBJECTS, {
      retention: RetentionPolicy.Interest,
      storage: StorageType.File,
      max_age: nanos(replyMaxAgeMs),
      max_bytes: replyMaxBytes,
      discard: DiscardPolicy.Old,
      // JetStream refuses a duplicate window longer than max_age.
      duplicate_window: nanos(Math.min(duplicateWindowMs, replyMaxAgeMs)),
    });
  }

  private async declare(channel: string): Promise<void> {
    this.assertChannel(channel);
    const channels = this.isDeadLetterChannel(channel)
      ? [channel]
      : [channel, this.deadLetterChannel(channel)];
    const jsm = await this.manager();
    for (const each of channels) {
      await this.declareStream(jsm, each, each, {
        retention: RetentionPolicy.Workqueue,
        storage: StorageType.File,
        duplicate_window: nanos(this.settings.duplicateWindowMs),
      });
      await this.declareConsumer(jsm, each, this.stream(each), {
        durable: this.settings.durableName,
        ackWaitMs: this.settings.ackWaitMs,
        maxDeliver: this.isDeadLetterChannel(each) ? -1 : this.settings.maxDeliver,
      });
      await this.repairRolledBack(jsm, each, this.stream(each));
    }
  }

  /**
   * Declares `channel`'s stream, on the one subject `subject`, with `config`; an existing stream of
   * that name is used as it is if it has that subject.
   */
  private async declareStream(
    jsm: JetStreamManager,
    channel: string,
    subject: string,
    config: Partial<StreamConfig>,
  ): Promise<void> {
    const name = config.name ?? this.stream(channel);
    try {
      const info = await jsm.streams.info(name);
      if (!info.config.subjects?.includes(subject)) {
        throw new NatsTopologyError(
          channel,
          name,
          `the stream exists with subjects ${JSON.stringify(info.config.subjects ?? [])}, ` +
            `not ${subject}; delete it or choose another streamPrefix`,
        );
      }
      this.noteWindow(name, info);
      return;
    } catch (error) {
      if (!isApiError(error, STREAM_NOT_FOUND)) throw this.refused(channel, name, error);
    }
    try {
      this.noteWindow(name, await jsm.streams.add({ ...config, name, subjects: [subject] }));
    } catch (error) {
      // Declared by another instance meanwhile: fine if it is the same stream.
      const info = await jsm.streams.info(name).catch(() => undefined);
      if (!info?.config.subjects?.includes(subject)) throw this.refused(channel, name, error);
      this.noteWindow(name, info);
    }
  }

  private async declareConsumer(
    jsm: JetStreamManager,
    channel: string,
    name: string,
    consumer: {
      readonly durable: string;
      readonly filterSubject?: string;
      readonly ackWaitMs: number;
      readonly maxDeliver: number;
    },
  ): Promise<void> {
    const { durable, filterSubject, maxDeliver } = consumer;
    const ackWait = nanos(consumer.ackWaitMs);
    try {
      const info = await jsm.consumers.info(name, durable);
      const problem = consumerProblem(info.config, filterSubject ?? channel, filterSubject);
      if (problem) {
        throw new NatsTopologyError(
          channel,
          name,
          `its consumer ${durable} exists ${problem}; delete it (\`nats consumer rm ${name} ` +
            `${durable}\`) and let the transport declare it, or choose another durableName`,
        );
      }
      if (info.config.ack_wait !== ackWait || info.config.max_deliver !== maxDeliver) {
        await jsm.consumers.update(name, durable, { ack_wait: ackWait, max_deliver: maxDeliver });
      }
      return;
    } catch (error) {
      if (!isApiError(error, CONSUMER_NOT_FOUND)) throw this.refused(channel, name, error);
    }
    try {
      await jsm.consumers.add(name, {
        durable_name: durable,
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
        ack_wait: ackWait,
        max_deliver: maxDeliver,
        ...(filterSubject === undefined ? {} : { filter_subject: filterSubject }),
        // Each subscription bounds what it holds (its prefetch); the consumer does not.
        max_ack_pending: -1,
      });
    } catch (error) {
      const info = await jsm.consumers.info(name, durable).catch(() => undefined);
      if (!info) throw this.refused(channel, name, error);
    }
  }

  /**
   * Makes again the consumers of a work-queue stream whose sequence went back below what they
   * have delivered: a server killed at the wrong moment can come back with an emptied stream's
   * sequence at 0 (see docs/transports.md). Its consumers would skip every message until the
   * sequence caught up with theirs, so each that has delivered anything is deleted and added
   * again with its configuration: a work-queue stream holds only what nobody has acked, and the
   * new consumer delivers all of it (what was in flight comes again, marked delivered once).
   * The consumers are read before the stream, so a message stored and delivered between the two
   * reads cannot look like a step back. One check runs per stream at a time, and a consumer made
   * again since it was listed (by another instance repairing too) is left alone.
   */
  private repairRolledBack(jsm: JetStreamManager, channel: string, stream: string): Promise<void> {
    let pending = this.repairs.get(stream);
    if (!pending) {
      pending = this.checkRolledBack(jsm, channel, stream).finally(() =>
        this.repairs.delete(stream),
      );
      this.repairs.set(stream, pending);
    }
    return pending;
  }

  private async checkRolledBack(
    jsm: JetStreamManager,
    channel: string,
    stream: string,
  ): Promise<void> {
    const consumers: ConsumerInfo[] = [];
    for await (const consumer of jsm.consumers.list(stream)) consumers.push(consumer);
    const { state } = await jsm.streams.info(stream);
    const ahead = consumers.filter((consumer) => consumer.delivered.stream_seq > state.last_seq);
    if (ahead.length === 0) return;
    this.logger.error(
      `stream ${stream} of ${channel} is at sequence ${state.last_seq}, behind what its ` +
        `consumers delivered (${ahead.map((c) => `${c.name}: ${c.delivered.stream_seq}`).join(', ')}): ` +
        `the server lost its sequence in a crash; making its consumers again, to deliver what ` +
        `it holds (${state.messages} messages)`,
    );
    for (const consumer of consumers) {
      if (consumer.delivered.stream_seq === 0) continue;
      // Made again already (by another instance repairing too): that one serves.
      const now = await jsm.consumers.info(stream, consumer.name).catch(() => undefined);
      if (now && now.created !== consumer.created) continue;
      await jsm.consumers.delete(stream, consumer.name).catch((error: unknown) => {
        if (!isApiError(error, CONSUMER_NOT_FOUND)) throw error;
      });
      await jsm.consumers.add(stream, consumer.config).catch(async (error: unknown) => {
        if (!(await jsm.consumers.info(stream, consumer.name).catch(() => undefined))) throw error;
      });
    }
  }

  /**
   * `error` as a refusal of the channel's stream or consumer ({@link NatsTopologyError}, final),
   * unless it is no answer about them at all: a lost request, or a cluster without a leader just
   * then, which the caller waits out as it would a server that is away.
   */
  private refused(channel: string, stream: string, error: unknown): Error {
    if (error instanceof NatsTopologyError) return error;
    if (!(error instanceof JetStreamApiError) || isLeaderlessAnswer(error)) return error as Error;
    return new NatsTopologyError(channel, stream, errorMessage(error), error);
  }
}

/**
 * Why an existing consumer cannot be one of the transport's: it must be a pull consumer (the
 * subscription pulls), settle each message on its own (explicit acks: with `none` a requeued or
 * failed message is gone, with `all` an ack settles every earlier message still in progress),
 * and deliver the channel's messages only (`subject`, or everything when `filter` is not
 * required: a stream declared by the transport has that one subject). Undefined when it can.
 */
function consumerProblem(
  config: ConsumerConfig,
  subject: string,
  filter: string | undefined,
): string | undefined {
  if (typeof config.deliver_subject === 'string' && config.deliver_subject !== '') {
    return `as a push consumer (deliver_subject ${config.deliver_subject}); the transport pulls`;
  }
  if (config.ack_policy !== AckPolicy.Explicit) {
    return (
      `with ack_policy ${config.ack_policy}, not explicit: a message requeued or left unsettled ` +
      `would be lost`
    );
  }
  const filters = [config.filter_subject, ...(config.filter_subjects ?? [])].filter(
    (each): each is string => typeof each === 'string' && each !== '',
  );
  const fits =
    filters.length === 0 ? filter === undefined : filters.length === 1 && filters[0] === subject;
  if (!fits) {
    return `with filter ${filters.length === 0 ? 'none' : JSON.stringify(filters)}, not ${subject}`;
  }
  return undefined;
}

/**
 * Whether `error` is the answer of a JetStream cluster without a leader just then (see
 * PASSING_API_ERRORS): no answer about the stream or consumer asked about, to be waited out.
 */
export function isLeaderlessAnswer(error: unknown): boolean {
  return error instanceof JetStreamApiError && PASSING_API_ERRORS.has(error.code);
}

function isApiError(error: unknown, code: number): boolean {
  return error instanceof JetStreamApiError && error.code === code;
}
