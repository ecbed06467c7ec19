import { randomUUID } from 'node:crypto';
import { Logger } from '@nestjs/common';
import {
  jetstream,
  jetstreamManager,
  JetStreamApiError,
  JetStreamError,
  type Consumer,
  type JetStreamClient,
  type JetStreamManager,
  type JetStreamPublishOptions,
} from '@nats-io/jetstream';
import {
  connectNats,
  natsHeaders,
  type NatsConnection,
  type NatsConnectionOptions,
} from './nats.client';
import { delay, settlesWithin, withTimeout } from '../../../core/async';
import { BrokerUnavailableError } from '../../../core/errors/broker-unavailable.error';
import { errorMessage } from '../../../core/errors/caught';
import { InvalidHeaderError } from '../../../core/errors/invalid-header.error';
import { MessageTooLargeError } from '../../../core/errors/message-too-large.error';
import { PublishRejectedError } from '../../../core/errors/publish-rejected.error';
import { PublishTimeoutError } from '../../../core/errors/publish-timeout.error';
import { PartitionCountMismatchError } from '../../../core/errors/partition-count-mismatch.error';
import { partitionsProblem } from '../../../core/partition';
import { DROPPED_HEADERS_HEADER } from '../../../ports/transport-headers';
import { SequenceHeader, type HeaderMap } from '../../../core/headers';
import { leaseClock, msSince } from '../../../core/lease-clock';
import {
  assertSendable,
  DEFAULT_REPLY_PREFETCH,
  publishTimeoutMs,
  REQUEUE_COUNT_HEADER,
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
import {
  encodedHeaderBytes,
  encodeHeaders,
  fitForwardedHeaders,
  HEADER_OVERHEAD_BYTES,
  MSG_ID_HEADER,
} from './nats.headers';
import {
  resolveNatsTransportOptions,
  type NatsTransportOptions,
  type ResolvedNatsTransportOptions,
} from './nats.options';
import { NatsDuplicateWindowError } from './errors/nats-duplicate-window.error';
import { NatsTopologyError } from './errors/nats-topology.error';
import {
  isReplyChannel,
  partitionConsumerName,
  partitionSubject,
  REPLY_SUBJECT_PREFIX,
} from './nats.naming';
import { NatsPartitionLeases } from './nats.partition-leases';
import { NatsPartitionedSubscription } from './nats.partitioned-subscription';
import type { DeadLetterBox } from '../../../ports/dead-letter-box.port';
import { deleteFoundNothing, NatsDeadLetterBox } from './nats.dead-letter-box';
import { NatsDeliveryLimitWatch } from './nats.delivery-limit';
import { assemblePayloadsInPlace } from './nats-payload-reads';
import { socketTricksEnabled } from '../../socket-tricks.guard';
import { NatsSubscription, type NatsSubscriptionSettings } from './nats.subscription';
import { isLeaderlessAnswer, NatsTopology, partitionAckWaitMs } from './nats.topology';

/** How long `ping` waits for the server's answer. */
const PING_TIMEOUT_MS = 5_000;
/** Longest wait for an answer of the JetStream API (declarations, account info). */
const API_TIMEOUT_MS = 3_000;
/** The headers a forward adds and keeps while others are left out to fit `max_payload`. */
const FORWARDED_HEADERS = {
  reason: SequenceHeader.deathReason,
  dropped: DROPPED_HEADERS_HEADER,
  keep: [REQUEUE_COUNT_HEADER],
} as const;
/** Pause before a declaration a JetStream cluster without a leader answered is tried again. */
const LEADERLESS_RETRY_MS = 200;
/** Longest wait for one PubAck before the publish is sent again (same `Nats-Msg-Id`). */
const MIN_ATTEMPT_MS = 2_000;

/**
 * {@link Transport} over NATS JetStream, through the official client (`@nats-io/transport-node`
 * and `@nats-io/jetstream` 3.x).
 *
 * - Each channel is a stream on the subject `<channel>` with a durable pull consumer, and has a
 *   dead-letter channel `<channel>.dlq` (its own stream and consumer); docs/transports.md tells
 *   what is declared and how channels map to stream names. Both are declared before the first
 *   publish or subscribe, so messages published before anyone subscribes are kept.
 * - `publish` resolves on the stream's `PubAck`. Every attempt of one publish carries the same
 *   `Nats-Msg-Id`, so a publish sent again after a lost connection or a late PubAck is stored
 *   once (within the stream's duplicate window). A PubAck error (the stream full, say) rejects
 *   with `PublishRejectedError`.
 * - Header values keep their type (see nats.headers); `NATS-*` header names are refused.
 * - `maxMessageBytes` is the server's `max_payload` (1 MiB unless configured) less room for the
 *   transport's own headers, so the module's default fragment size follows the server.
 * - Subscriptions resume by themselves after a reconnect or a server restart; see
 *   docs/transports.md for how each disposition is settled.
 * - {@link NatsTransport.openReplyChannel} reads a subject `nseq-reply.<uuid>` of one shared
 *   reply stream through a consumer of its own; a publish to a closed reply channel resolves
 *   (the stream takes the reply and, with nobody interested, discards it).
 *
 * A transport made by {@link NatsTransport.connect} owns its connection and drains it on
 * `close()`; one given a connection leaves it open.
 *
 * @example
 * ```ts
 * SequenceModule.forRootAsync({
 *   useFactory: async () => ({
 *     transport: await NatsTransport.connect({ servers: process.env.NATS_URL }),
 *   }),
 * });
 * ```
 */
export class NatsTransport implements Transport {
  readonly name = 'nats';
  readonly maxMessageBytes: number;
  /** Partitioned channels: see {@link NatsTransport.subscribe} and docs/transports.md. */
  readonly partitioned = true;

  /**
   * Below the duplicate window of the streams it declares: `duplicateWindowMs`, and for the reply
   * stream at most `replyMaxAgeMs`. A publish retried past it could be stored twice, so one given
   * longer is refused.
   */
  get maxPublishTimeoutMs(): number {
    return Math.min(this.settings.duplicateWindowMs, this.settings.replyMaxAgeMs) - 1;
  }

  private readonly settings: ResolvedNatsTransportOptions;
  private readonly logger = new Logger(NatsTransport.name);
  private readonly js: JetStreamClient;
  private readonly topology: NatsTopology;
  private readonly subscriptions = new Set<Subscription>();
  /** The server's `max_payload`: a message over it is refused by the client. */
  private readonly maxPayload: number;
  private manager?: Promise<JetStreamManager>;
  private ownsConnection = false;
  /** The connection's status events, watched from construction until close. */
  private statuses?: { stop?(): void };
  private deadLetterBox?: NatsDeadLetterBox;
  /** False between a `disconnect` status and the next `reconnect`. */
  private connected = true;
  /** Set as `close()` starts: new publishes and subscriptions are refused. */
  private closed = false;
  /**
   * Set once the subscriptions have closed: until then, their own forwards (dead letters, the
   * copy at the tail of a message handed back at its last delivery) still publish.
   */
  private stopped = false;
  private closing?: Promise<void>;
  private readonly deadLetterListeners = new Set<(channel: string, reason: string) => void>();

  /**
   * @param connection a connected `NatsConnection`; it stays the caller's to close. Give it
   *   `maxReconnectAttempts: -1` for subscriptions that outlive any outage.
   */
  constructor(
    private readonly connection: NatsConnection,
    options: NatsTransportOptions = {},
  ) {
    this.settings = resolveNatsTransportOptions(options);
    const maxPayload = connection.info?.max_payload;
    if (typeof maxPayload !== 'number' || maxPayload <= HEADER_OVERHEAD_BYTES) {
      throw new Error(
        'NatsTransport needs a connected NatsConnection (its server info tells max_payload)',
      );
    }
    this.maxPayload = maxPayload;
    const largest = maxPayload - HEADER_OVERHEAD_BYTES;
    const asked = this.settings.maxMessageBytes;
    if (asked !== undefined && asked > largest) {
      throw new RangeError(
        `NatsTransport maxMessageBytes ${asked} exceeds what the server takes: its max_payload ` +
          `is ${maxPayload}, so at most ${largest}; raise max_payload in the server's configuration`,
      );
    }
    this.maxMessageBytes = asked ?? largest;
    this.applySocketTricks();
    this.js = jetstream(connection, { timeout: this.settings.publishTimeoutMs });
    this.topology = new NatsTopology(this.settings, () => this.jsm(), this.logger);
    void this.watchStatus();
  }

  /**
   * With `unsafeSocketTricks`, has the connection gather large payloads in place
   * (nats-payload-reads). Never throws: a client of another shape is left as it is.
   */
  private applySocketTricks(): void {
    const { unsafeSocketTricks } = this.settings;
    if (!socketTricksEnabled(unsafeSocketTricks, '@nats-io/nats-core', NatsTransport.name)) return;
    try {
      if (!assemblePayloadsInPlace(this.connection)) {
        this.logger.warn(
          'unsafeSocketTricks is on, but the connection is not of the shape its tricks were ' +
            'written for: it receives payloads as the client does',
        );
      }
    } catch {
      // left as the client made it
    }
  }

  /**
   * Connects (reconnecting for ever after a lost connection unless `connection` says otherwise)
   * and returns a transport whose `close()` drains and closes that connection.
   *
   * @param connection `@nats-io/transport-node` connection options, e.g.
   *   `{ servers: 'nats://127.0.0.1:4222' }`.
   */
  static async connect(
    connection: NatsConnectionOptions,
    options: NatsTransportOptions = {},
  ): Promise<NatsTransport> {
    resolveNatsTransportOptions(options); // fail on bad options before connecting
    const nc = await connectNats({ maxReconnectAttempts: -1, ...connection });
    try {
      const transport = new NatsTransport(nc, options);
      transport.ownsConnection = true;
      return transport;
    } catch (error) {
      await nc.close();
      throw error;
    }
  }

  async publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    options: PublishOptions = {},
  ): Promise<void> {
    this.assertOpen('publish to', channel);
    assertSendable(channel, body, headers, this.maxMessageBytes);
    this.topology.assertChannel(channel);
    const timeoutMs = publishTimeoutMs(channel, options.timeoutMs, this.settings.publishTimeoutMs);
    const { partition } = options;
    if (partition !== undefined) {
      assertPartitionAddress(channel, partition);
      this.topology.assertPartitionable(channel);
    }
    await this.send(
      channel,
      body,
      headers,
      timeoutMs,
      options.resend ?? true,
      undefined,
      partition,
    );
  }

  /**
   * The dead letters in this transport's dead-letter streams, to browse, replay and discard. They
   * are read by sequence number (`STREAM.MSG.GET`), which neither takes them from the stream nor
   * touches its consumer; an id is the message's sequence in the dead-letter stream.
   */
  deadLetters(): DeadLetterBox {
    this.deadLetterBox ??= new NatsDeadLetterBox({
      jsm: () => this.jsm(),
      stream: (channel) => this.topology.stream(channel),
      deadLetterChannel: (channel) => this.deadLetterChannel(channel),
      publish: (channel, body, headers, msgId) => {
        this.assertOpen('publish to', channel);
        assertSendable(channel, body, headers, this.maxMessageBytes);
        this.topology.assertChannel(channel);
        return this.send(channel, body, headers, this.settings.publishTimeoutMs, true, msgId);
      },
    });
    return this.deadLetterBox;
  }

  async subscribe(
    channel: string,
    handler: MessageHandler,
    options: SubscribeOptions = {},
  ): Promise<Subscription> {
    this.assertOpen('subscribe to', channel);
    const prefetch = options.prefetch ?? this.settings.prefetch;
    const problem = prefetchProblem(prefetch);
    if (problem) throw new RangeError(problem);
    if (isReplyChannel(channel)) {
      const stream = this.topology.stream(channel);
      const why = `channels under ${REPLY_SUBJECT_PREFIX} are reply channels: open one with openReplyChannel`;
      throw new NatsTopologyError(channel, stream, why);
    }
    if (options.partitions !== undefined) {
      return this.subscribePartitioned(channel, handler, prefetch, options);
    }
    // Connected: declared now, so that a refusal reaches the caller. Not connected: at once, and
    // the subscription declares its stream when the connection is back.
    this.topology.assertChannel(channel);
    if (this.connected) {
      await this.whileOpen('subscribe to', channel, this.topology.ensure(channel)).catch(
        (error) => {
          if (error instanceof NatsTopologyError || this.closed) throw error;
          // The server is away: the subscription declares its stream once it can, and then pulls.
          this.logger.warn(
            `could not declare ${channel} yet (${errorMessage(error)}); subscribing anyway`,
          );
        },
      );
    }
    const endOfLine = this.topology.isDeadLetterChannel(channel);
    let consumer: Consumer | undefined;
    return this.startSubscription({
      channel,
      handler,
      prefetch,
      deadLetterChannel: options.deadLetterChannel ?? this.deadLetterChannel(channel),
      maxDeliver: endOfLine ? undefined : this.settings.maxDeliver,
      endOfLine,
      consumerName: this.settings.durableName,
      // Declared again after a reconnect (which forgets the declarations), repairing what a
      // server restart may have broken; cached otherwise.
      consumer: async () => {
        await this.topology.ensure(channel);
        if (!consumer) {
          consumer = await this.js.consumers.get(
            this.topology.stream(channel),
            this.settings.durableName,
          );
        }
        return consumer;
      },
      onConsumerLost: () => {
        consumer = undefined;
        this.topology.forget(channel);
      },
    });
  }

  /**
   * `subscribe` with `partitions`: claims the partitions nobody holds and pulls from those (see
   * {@link NatsPartitionedSubscription}).
   */
  private async subscribePartitioned(
    channel: string,
    handler: MessageHandler,
    prefetch: number,
    options: SubscribeOptions,
  ): Promise<Subscription> {
    const count = options.partitions!;
    const problem = partitionsProblem(count);
    if (problem) throw new RangeError(`subscribe to ${channel}: ${problem}`);
    this.topology.assertPartitionable(channel);
    // Declared now, so that a refusal or a count mismatch reaches the caller.
    const leaseMs = await this.whileOpen(
      'subscribe to',
      channel,
      this.onceLed(channel, this.topology.partitionStream(channel), () =>
        this.topology.ensurePartitionSubscription(channel, count),
      ),
    );
    const stream = this.topology.partitionStream(channel);
    const deadLetterChannel = options.deadLetterChannel ?? this.deadLetterChannel(channel);
    const leases = new NatsPartitionLeases({
      channel,
      stream: this.topology.leaseStream(channel),
      owner: randomUUID(),
      js: this.js,
      jsm: () => this.jsm(),
      connection: this.connection,
      timeoutMs: Math.min(this.settings.publishTimeoutMs, Math.max(100, leaseMs / 3)),
    });
    const subscription = new NatsPartitionedSubscription({
      channel,
      count,
      ensure: () => this.topology.ensurePartitionSubscription(channel, count),
      forget: () => this.topology.forgetPartitions(channel),
      leases,
      logger: this.logger,
      onClosed: (closed) => this.subscriptions.delete(closed),
      open: (index, mayHold, mayExtend) => {
        const partition = { index, count };
        let consumer: Consumer | undefined;
        return this.startSubscription({
          channel,
          handler,
          prefetch,
          deadLetterChannel,
          maxDeliver: this.settings.maxDeliver,
          consumerName: partitionConsumerName(this.settings.durableName, index),
          ackWaitMs: partitionAckWaitMs(this.settings.ackWaitMs, leaseMs),
          mayHold,
          mayExtend,
          partition: index,
          consumer: async () => {
            await this.topology.ensurePartitionSubscription(channel, count);
            if (!consumer) {
              consumer = await this.js.consumers.get(
                stream,
                partitionConsumerName(this.settings.durableName, index),
              );
            }
            return consumer;
          },
          onConsumerLost: () => {
            consumer = undefined;
            this.topology.forgetPartitions(channel);
          },
          // A delayed requeue's copy goes to the tail of the same partition.
          publish: (target, body, headers, msgId) =>
            this.forward(target, body, headers, { channel, partition }, msgId),
          stream,
        });
      },
    });
    this.subscriptions.add(subscription);
    try {
      await subscription.start();
    } catch (error) {
      // Closed, which takes it out of the set (onClosed): the caller hears of the first error.
      await subscription.close().catch(() => undefined);
      throw error;
    }
    if (this.closed) {
      // close() closes it too (it was in the set): its leases are released once it has.
      await subscription.close();
      this.assertOpen('subscribe to', channel);
    }
    return subscription;
  }

  /** Whether `channel` is one of this transport's reply channels (see the Transport port). */
  isReplyChannel(channel: string): boolean {
    return channel.startsWith(REPLY_SUBJECT_PREFIX);
  }

  /**
   * Opens a reply channel: a subject `nseq-reply.<uuid>` of the reply stream (declared once, see
   * docs/transports.md) and a consumer `reply-<uuid>` filtered on it, which the subscription pulls
   * from with `prefetch`. Closing deletes the consumer; a process that ends without closing
   * leaves it to the server, which removes it after a minute without a pull. A reply the handler
   * dead-letters, or requeues until its `maxDeliver`-th delivery, is acked and dropped with a
   * warning.
   */
  async openReplyChannel(
    handler: MessageHandler,
    options: ReplyChannelOptions = {},
  ): Promise<Subscription> {
    this.assertOpen('open', 'a reply channel');
    const prefetch = options.prefetch ?? DEFAULT_REPLY_PREFETCH;
    const problem = prefetchProblem(prefetch);
    if (problem) throw new RangeError(problem);
    const id = randomUUID();
    const channel = `${REPLY_SUBJECT_PREFIX}${id}`;
    const name = `reply-${id}`;
    const { maxDeliver } = this.settings;
    // Made as close() started, the consumer is deleted: nothing will pull from it.
    const deleteConsumer = () => this.topology.deleteReplyConsumer(channel, name);
    await this.whileOpen(
      'open',
      'a reply channel',
      this.onceLed(channel, this.topology.stream(channel), () =>
        this.topology.ensureReplyConsumer(channel, name, maxDeliver),
      ),
      deleteConsumer,
    );
    // Closed since (a microtask or two): its consumer goes, nothing starts.
    if (this.closed) {
      this.undoAfterClose(deleteConsumer);
      this.assertOpen('open', 'a reply channel');
    }
    let consumer: Consumer | undefined;
    return this.startSubscription({
      channel,
      handler,
      prefetch,
      deadLetterChannel: undefined,
      maxDeliver,
      consumerName: name,
      consumer: async () => {
        if (!consumer) {
          // Made again when the server lost it (a restart) or removed it (inactive too long).
          await this.topology.ensureReplyConsumer(channel, name, maxDeliver);
          consumer = await this.js.consumers.get(this.topology.stream(channel), name);
        }
        return consumer;
      },
      onConsumerLost: () => {
        consumer = undefined;
        this.topology.forget(channel);
      },
      release: () => this.topology.deleteReplyConsumer(channel, name),
    });
  }

  /**
   * `declare()`, tried again while the JetStream cluster has no leader (after a node restarts, or
   * while too few nodes run), as a publish waits for it: for `publishTimeoutMs` at most (and the
   * attempt then under way), then a {@link NatsTopologyError} naming `channel`. Once the cluster
   * has answered so, a request lost meanwhile (the election under way) is waited out too; a
   * refusal is final. What needs its declaration before it can start (a partitioned
   * subscription, which reads its lease time from the lease stream; a reply channel, whose name
   * its requester sends at once) waits so.
   */
  private async onceLed<T>(channel: string, stream: string, declare: () => Promise<T>): Promise<T> {
    const timeoutMs = this.settings.publishTimeoutMs;
    const started = leaseClock();
    let leaderless = false;
    for (;;) {
      try {
        return await declare();
      } catch (error) {
        leaderless ||= isLeaderlessAnswer(error);
        const final =
          error instanceof NatsTopologyError || error instanceof PartitionCountMismatchError;
        if (!leaderless || final || this.closed) throw error;
        if (msSince(started) >= timeoutMs) {
          throw new NatsTopologyError(
            channel,
            stream,
            `the JetStream cluster had no leader for ${timeoutMs} ms (publishTimeoutMs): ` +
              `${errorMessage(error)}; try again once a quorum of its nodes runs`,
            error as Error,
            false,
          );
        }
        await delay(Math.min(LEADERLESS_RETRY_MS, Math.max(0, timeoutMs - msSince(started))));
      }
    }
  }

  /** A subscription with the transport's settings, pulling from `consumer`. */
  private startSubscription(
    own: Pick<
      NatsSubscriptionSettings,
      | 'channel'
      | 'handler'
      | 'prefetch'
      | 'deadLetterChannel'
      | 'maxDeliver'
      | 'consumer'
      | 'onConsumerLost'
      | 'release'
    > &
      Partial<
        Pick<
          NatsSubscriptionSettings,
          'ackWaitMs' | 'mayHold' | 'mayExtend' | 'partition' | 'publish' | 'endOfLine'
        >
      > & {
        /** The stream the consumer reads. @default the channel's */
        readonly stream?: string;
        /** The name of the durable consumer it pulls from. */
        readonly consumerName: string;
      },
  ): NatsSubscription {
    const { channel, deadLetterChannel } = own;
    // The callers' last look at `closed` may be a microtask or two behind: a close() started
    // since has taken its list of subscriptions, and would leave this one running.
    this.assertOpen('subscribe to', channel);
    const { nakDelayMs, maxNakDelayMs, ackWaitMs } = this.settings;
    const stream = own.stream ?? this.topology.stream(channel);
    const readStored = async (sequence: number) => {
      const jsm = await this.jsm();
      return (await jsm.streams.getMessage(stream, { seq: sequence })) ?? undefined;
    };
    const watch =
      deadLetterChannel === undefined || own.maxDeliver === undefined
        ? undefined
        : new NatsDeliveryLimitWatch({
            channel,
            stream,
            consumer: own.consumerName,
            deadLetterChannel,
            connection: this.connection,
            read: (sequence) =>
              readStored(sequence).catch((error: unknown) => {
                if (deleteFoundNothing(error)) return undefined;
                throw error;
              }),
            publish: (body, headers, msgId) =>
              this.forward(deadLetterChannel, body, headers, { channel }, msgId),
            remove: async (sequence) => {
              const jsm = await this.jsm();
              return jsm.streams.deleteMessage(stream, sequence, false).catch((error: unknown) => {
                if (deleteFoundNothing(error)) return false;
                throw error;
              });
            },
            deadLettered: (reason) => this.toldDeadLetter(channel, reason),
            logger: this.logger,
            publishTimeoutMs: this.settings.publishTimeoutMs,
            // The stream's own once declared: one made by hand may have a shorter window.
            duplicateWindowMs: () =>
              this.topology.duplicateWindowMs(this.topology.stream(deadLetterChannel)) ??
              this.settings.duplicateWindowMs,
          });
    const { release } = own;
    const subscription = new NatsSubscription({
      ...own,
      release:
        watch || release
          ? async () => {
              await watch?.stop();
              await release?.();
            }
          : undefined,
      onOwnDeadLetter: (reason) => this.toldDeadLetter(channel, reason),
      nakDelayMs: (deliveries) =>
        Math.min(nakDelayMs * 2 ** Math.max(0, deliveries - 1), maxNakDelayMs),
      ackWaitMs: own.ackWaitMs ?? ackWaitMs,
      publish:
        own.publish ??
        ((target, body, headers, msgId) => this.forward(target, body, headers, { channel }, msgId)),
      readFromStream: async (sequence) => {
        const stored = await readStored(sequence);
        if (!stored) throw new Error(`message ${sequence} is no longer in stream ${stream}`);
        const data = stored.data;
        return Buffer.from(data.buffer, data.byteOffset, data.byteLength);
      },
      respond: (subject, payload) => this.connection.publish(subject, payload),
      pullMaxBytes: this.settings.pullMaxBytes,
      maxPayload: this.maxPayload,
      removeFromStream: async (sequence) => {
        const jsm = await this.jsm();
        // Without a flush the delete could overtake the term and find the message still pending.
        await this.flush();
        await jsm.streams.deleteMessage(stream, sequence, false);
      },
      flush: () => this.flush(),
      logger: this.logger,
      onClosed: (closed) => this.subscriptions.delete(closed),
    });
    // The watch first: it throws on a closed or draining connection, with nothing started yet.
    watch?.start();
    this.subscriptions.add(subscription);
    subscription.start();
    return subscription;
  }

  /**
   * Calls `listener` for each dead letter the transport stores on its own, once stored: a message
   * still requeued at its `maxDeliver`-th delivery, and one the server stopped delivering at its
   * `max_deliver` unsettled (`max-deliver: …`). Dead letters given as a `dead-letter` disposition
   * are not told. Returns a function that stops telling it.
   */
  onDeadLetter(listener: (channel: string, reason: string) => void): () => void {
    this.deadLetterListeners.add(listener);
    return () => this.deadLetterListeners.delete(listener);
  }

  private toldDeadLetter(channel: string, reason: string): void {
    for (const listener of this.deadLetterListeners) {
      try {
        listener(channel, reason);
      } catch (error) {
        this.logger.warn(`a dead-letter listener failed: ${errorMessage(error)}`);
      }
    }
  }

  /** `<channel><deadLetterSuffix>`: `<channel>.dlq` unless the `deadLetterSuffix` option says. */
  deadLetterChannel(channel: string): string {
    return this.topology.deadLetterChannel(channel);
  }

  /** Resolves when the server answers a round trip and JetStream answers an account query. */
  async ping(): Promise<void> {
    if (this.closed || this.connection.isClosed()) throw new Error('nats transport is closed');
    // Lost, and the client is making it again: said at once rather than after the timeout.
    if (!this.connected) {
      throw new BrokerUnavailableError(
        'nats',
        'reconnecting',
        'not connected to NATS (reconnecting)',
      );
    }
    await withTimeout(
      (async () => {
        await this.connection.rtt();
        await (await this.jsm()).getAccountInfo();
      })(),
      PING_TIMEOUT_MS,
      () =>
        new BrokerUnavailableError(
          'nats',
          'not-answering',
          `NATS did not answer within ${PING_TIMEOUT_MS} ms`,
        ),
    );
  }

  /**
   * Closes every subscription (their unsettled messages go back to the consumer at once) and,
   * when {@link NatsTransport.connect} made the connection, drains and closes it. A `subscribe`
   * or `openReplyChannel` still under way rejects, starting nothing. Idempotent.
   */
  close(): Promise<void> {
    this.closing ??= this.shutdown();
    return this.closing;
  }

  private async shutdown(): Promise<void> {
    this.closed = true;
    const timeoutMs = this.settings.publishTimeoutMs;
    await withTimeout(
      Promise.all([...this.subscriptions].map((subscription) => subscription.close())),
      timeoutMs,
      () => new Error(`subscriptions still closing after ${timeoutMs} ms; not awaited`),
    ).catch((error: unknown) => this.logger.warn(`closing the transport: ${errorMessage(error)}`));
    this.stopped = true;
    this.statuses?.stop?.();
    if (this.ownsConnection && !this.connection.isClosed()) {
      // Bounded as a flush is: a drain ends with one.
      const drained = this.connection.drain().catch(() => this.connection.close());
      if (!(await settlesWithin(drained, timeoutMs))) {
        this.logger.warn(`the connection did not drain within ${timeoutMs} ms; closed it`);
        await this.connection.close().catch(() => undefined);
      }
    }
  }

  /**
   * Publishes a message the subscription of `from.channel` forwards on its own: a dead letter, or
   * a copy requeued at the tail of the channel (of `from.partition`, if any). Not checked against
   * `maxMessageBytes` (the server already holds the message), and allowed while `close()` waits
   * for the subscriptions. A dead letter's headers are cut to fit `max_payload`
   * ({@link fitForwardedHeaders}); a copy keeps every header, which its next handler reads.
   * @throws MessageTooLargeError when the forward does not fit `max_payload`
   */
  private async forward(
    target: string,
    body: Buffer,
    headers: Readonly<Record<string, unknown>>,
    from: { readonly channel: string; readonly partition?: PartitionAddress },
    msgId?: string,
  ): Promise<{ readonly duplicate: boolean }> {
    const copy = target === from.channel;
    const fitted = copy
      ? headers
      : fitForwardedHeaders(headers, this.maxPayload - body.length, FORWARDED_HEADERS);
    if (fitted === undefined) {
      throw new MessageTooLargeError(target, body.length, this.maxMessageBytes);
    }
    const { publishTimeoutMs } = this.settings;
    const partition = copy ? from.partition : undefined;
    return this.send(target, body, fitted, publishTimeoutMs, true, msgId, partition, true);
  }

  /**
   * Publishes and waits for the PubAck, all within `timeoutMs`. With `resend`, an attempt that
   * gets no PubAck (a lost connection, a slow server) is sent again with the same `Nats-Msg-Id`,
   * which the stream stores once; without, the first failure is final. A `timeoutMs` that reaches
   * the stream's duplicate window is refused with {@link NatsDuplicateWindowError} before anything
   * is sent (a subscription's own forward is sent again within the window only instead).
   */
  private async send(
    channel: string,
    body: Buffer,
    headers: Readonly<Record<string, unknown>>,
    timeoutMs: number,
    resend = true,
    msgId: string = randomUUID(),
    partition?: PartitionAddress,
    forwarding = false,
  ): Promise<{ readonly duplicate: boolean }> {
    // A subscription's own forwards may go on until the subscriptions have closed; others stop
    // as close() starts.
    const ended = () => (forwarding ? this.stopped : this.closed);
    const encoded = encodeHeaders(headers);
    if (encoded.problem !== undefined) {
      throw new InvalidHeaderError(channel, encoded.name, encoded.problem);
    }
    const wireBytes = body.length + encodedHeaderBytes([...encoded.pairs, [MSG_ID_HEADER, msgId]]);
    if (wireBytes > this.maxPayload) {
      throw new MessageTooLargeError(channel, wireBytes, this.maxMessageBytes);
    }
    // On both clocks: a wall clock stepped back, or a monotonic one stopped while the machine was
    // suspended, would keep resending past the duplicate window, where a resend is stored again.
    const started = leaseClock();
    const elapsed = () => msSince(started);
    let budgetMs = timeoutMs;
    let handedOver = false;
    const timedOut = () => new PublishTimeoutError(channel, timeoutMs, handedOver);
    const subject = partition ? partitionSubject(channel, partition.index) : channel;
    const stream = partition
      ? this.topology.partitionStream(channel)
      : this.topology.stream(channel);
    const declare = () =>
      partition
        ? this.topology.ensurePartitions(channel, partition.count)
        : this.topology.ensure(channel);
    const forget = () =>
      partition ? this.topology.forgetPartitions(channel) : this.topology.forget(channel);
    for (;;) {
      try {
        await withTimeout(declare(), budgetMs - elapsed(), timedOut);
      } catch (error) {
        // A refusal is final; a server that is away or starting (its JetStream not answering
        // yet) is waited for, within the deadline.
        if (
          error instanceof NatsTopologyError ||
          error instanceof PublishTimeoutError ||
          error instanceof PartitionCountMismatchError
        ) {
          throw error;
        }
        if (ended() || elapsed() >= budgetMs) throw timedOut();
        await delay(50);
        continue;
      }
      // A resend after the stream's duplicate window would be stored a second time.
      const windowMs = resend ? this.topology.duplicateWindowMs(stream) : undefined;
      if (windowMs !== undefined && timeoutMs >= windowMs) {
        if (!forwarding) throw new NatsDuplicateWindowError(channel, stream, timeoutMs, windowMs);
        // A subscription's own forward has no caller to tell: it is sent again within the window
        // only (a dead letter's stream may have a shorter one than the transport would give it).
        budgetMs = Math.min(budgetMs, windowMs - 1);
      }
      if (ended() && !handedOver) {
        throw new Error(`nats transport is closed: cannot publish to ${channel}`);
      }
      const wire = natsHeaders();
      for (const [name, value] of encoded.pairs) wire.append(name, value);
      const remaining = budgetMs - elapsed();
      if (remaining <= 0) throw timedOut();
      try {
        handedOver = true;
        return await this.js.publish(subject, body, {
          msgID: msgId,
          headers: wire as unknown as JetStreamPublishOptions['headers'],
          timeout: resend
            ? Math.min(remaining, Math.max(MIN_ATTEMPT_MS, timeoutMs / 4))
            : remaining,
        });
      } catch (error) {
        if (isNoResponders(error)) {
          // No stream listens on the subject (deleted while we were connected): declare again.
          forget();
          if (!resend) {
            throw new PublishRejectedError(channel, error, 'no stream took it; not sent again');
          }
        } else if (error instanceof JetStreamApiError || isPubAckError(error)) {
          throw new PublishRejectedError(
            channel,
            error as Error,
            `PubAck error: ${errorMessage(error)}`,
          );
        } else if (!resend) {
          throw new PublishTimeoutError(
            channel,
            timeoutMs,
            true,
            `${errorMessage(error)}; not sent again (resend: false)`,
          );
        }
        if (ended() || this.connection.isClosed()) throw timedOut();
        if (elapsed() >= budgetMs) throw timedOut();
        await delay(20);
      }
    }
  }

  private jsm(): Promise<JetStreamManager> {
    if (!this.manager) {
      const pending = jetstreamManager(this.connection, {
        // Short, and retried by whoever declares: a request made while the connection is down
        // goes unanswered after the reconnect, and would hold a declaration for its whole timeout.
        timeout: Math.min(this.settings.publishTimeoutMs, API_TIMEOUT_MS),
        checkAPI: false,
      });
      this.manager = pending;
      pending.catch(() => {
        if (this.manager === pending) this.manager = undefined;
      });
    }
    return this.manager;
  }

  /**
   * Waits for the server to have what was sent, for at most `publishTimeoutMs`: a server that
   * stops answering (frozen, a network black hole) never answers a flush's PING, and what waits
   * on it (a subscription closing, a dead letter's delete) would wait until the client's own
   * pings found the connection stale, minutes later.
   */
  private flush(): Promise<void> {
    const timeoutMs = this.settings.publishTimeoutMs;
    return withTimeout(
      this.connection.flush(),
      timeoutMs,
      () => new Error(`NATS did not answer a flush within ${timeoutMs} ms`),
    );
  }

  /** On a reconnect, the server may be another or restarted empty: declare everything again. */
  private async watchStatus(): Promise<void> {
    // Stopped at close: a connection the application keeps would otherwise go on notifying a
    // closed transport for ever.
    const statuses = this.connection.status();
    this.statuses = statuses;
    for await (const status of statuses) {
      if (status.type === 'reconnect') {
        this.connected = true;
        this.topology.forget();
      }
      if (status.type === 'disconnect') {
        this.connected = false;
        this.logger.warn(`NATS connection lost; reconnecting`);
      }
    }
  }

  /**
   * What `pending` comes to, unless `close()` started meanwhile: then the error a call made after
   * close gets, whatever `pending` came to (a draining connection's own error, say), so that a
   * subscribe racing close starts nothing that close() would not stop. `undo`, if given, removes
   * what `pending` made; it is not awaited (the server may be what close() waits for).
   */
  private async whileOpen<T>(
    action: string,
    channel: string,
    pending: Promise<T>,
    undo?: () => Promise<unknown>,
  ): Promise<T> {
    let outcome: T;
    try {
      outcome = await pending;
    } catch (error) {
      this.assertOpen(action, channel);
      throw error;
    }
    if (this.closed && undo) this.undoAfterClose(undo);
    this.assertOpen(action, channel);
    return outcome;
  }

  /** Runs `undo` (what a call that close() overtook had made), not awaited; a failure is logged. */
  private undoAfterClose(undo: () => Promise<unknown>): void {
    undo().catch((error: unknown) =>
      this.logger.warn(`cleaning up after close(): ${errorMessage(error)}`),
    );
  }

  private assertOpen(action: string, channel: string): void {
    if (this.closed) throw new Error(`nats transport is closed: cannot ${action} ${channel}`);
  }
}

/** Throws a RangeError for a partition address that names no partition. */
function assertPartitionAddress(channel: string, partition: PartitionAddress): void {
  const problem = partitionAddressProblem(partition);
  if (problem) throw new RangeError(`publish to ${channel}: ${problem}`);
}

/** A JetStream error answer to a publish (not a lost request). */
function isPubAckError(error: unknown): boolean {
  return error instanceof JetStreamError && !isNoResponders(error);
}

/**
 * What the client rejects a publish with when no stream listens on its subject (a request with
 * no responders): `JetStreamNotEnabled`, a class its package does not export.
 */
function isNoResponders(error: unknown): error is Error {
  return error instanceof Error && error.name === 'JetStreamNotEnabled';
}
