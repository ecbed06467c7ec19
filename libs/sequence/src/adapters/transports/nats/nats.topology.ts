import {
  AckPolicy,
  DeliverPolicy,
  JetStreamApiError,
  RetentionPolicy,
  StorageType,
  type JetStreamManager,
} from '@nats-io/jetstream';
import { nanos } from './nats.client';
import { errorMessage } from '../../../core/errors/caught';
import { NatsTopologyError } from './errors/nats-topology.error';
import { streamName, subjectProblem } from './nats.naming';
import type { ResolvedNatsTransportOptions } from './nats.options';

/** JetStream API error codes the topology handles. */
const STREAM_NOT_FOUND = 10059;
const CONSUMER_NOT_FOUND = 10014;

/**
 * The JetStream objects behind a channel, declared idempotently: a stream `streamName(channel)`
 * on the one subject `<channel>` (file storage, work-queue retention: a message leaves the stream
 * once acked or terminated), and on it a durable pull consumer with explicit acks, `ack_wait` and
 * `max_deliver`. A channel's dead-letter channel `<channel><suffix>` gets the same, declared with
 * the channel; a dead-letter channel gets no dead-letter channel of its own, and its consumer no
 * `max_deliver`. An existing stream is used as it is (only its subject is checked); an existing
 * consumer whose `ack_wait` or `max_deliver` differ is updated.
 */
export class NatsTopology {
  private readonly declared = new Map<string, Promise<void>>();

  constructor(
    private readonly settings: ResolvedNatsTransportOptions,
    private readonly manager: () => Promise<JetStreamManager>,
  ) {}

  deadLetterChannel(channel: string): string {
    return `${channel}${this.settings.deadLetterSuffix}`;
  }

  isDeadLetterChannel(channel: string): boolean {
    return channel.endsWith(this.settings.deadLetterSuffix);
  }

  stream(channel: string): string {
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
    let pending = this.declared.get(channel);
    if (!pending) {
      pending = this.declare(channel);
      this.declared.set(channel, pending);
      pending.catch(() => {
        if (this.declared.get(channel) === pending) this.declared.delete(channel);
      });
    }
    return pending;
  }

  /** Forgets what was declared: after a reconnect, or when a stream turned out to be gone. */
  forget(channel?: string): void {
    if (channel === undefined) this.declared.clear();
    else this.declared.delete(channel);
  }

  private async declare(channel: string): Promise<void> {
    this.assertChannel(channel);
    const channels = this.isDeadLetterChannel(channel)
      ? [channel]
      : [channel, this.deadLetterChannel(channel)];
    const jsm = await this.manager();
    for (const each of channels) {
      await this.declareStream(jsm, each);
      await this.declareConsumer(jsm, each);
    }
  }

  private async declareStream(jsm: JetStreamManager, channel: string): Promise<void> {
    const name = this.stream(channel);
    try {
      const info = await jsm.streams.info(name);
      if (!info.config.subjects?.includes(channel)) {
        throw new NatsTopologyError(
          channel,
          name,
          `the stream exists with subjects ${JSON.stringify(info.config.subjects ?? [])}, ` +
            `not ${channel}; delete it or choose another streamPrefix`,
        );
      }
      return;
    } catch (error) {
      if (!isApiError(error, STREAM_NOT_FOUND)) throw this.refused(channel, name, error);
    }
    try {
      await jsm.streams.add({
        name,
        subjects: [channel],
        retention: RetentionPolicy.Workqueue,
        storage: StorageType.File,
        duplicate_window: nanos(this.settings.duplicateWindowMs),
      });
    } catch (error) {
      // Declared by another instance meanwhile: fine if it is the same stream.
      const info = await jsm.streams.info(name).catch(() => undefined);
      if (!info?.config.subjects?.includes(channel)) throw this.refused(channel, name, error);
    }
  }

  private async declareConsumer(jsm: JetStreamManager, channel: string): Promise<void> {
    const name = this.stream(channel);
    const durable = this.settings.durableName;
    const ackWait = nanos(this.settings.ackWaitMs);
    const maxDeliver = this.isDeadLetterChannel(channel) ? -1 : this.settings.maxDeliver;
    try {
      const info = await jsm.consumers.info(name, durable);
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
        // Each subscription bounds what it holds (its prefetch); the consumer does not.
        max_ack_pending: -1,
      });
    } catch (error) {
      const info = await jsm.consumers.info(name, durable).catch(() => undefined);
      if (!info) throw this.refused(channel, name, error);
    }
  }

  private refused(channel: string, stream: string, error: unknown): Error {
    if (error instanceof NatsTopologyError) return error;
    if (!(error instanceof JetStreamApiError)) return error as Error;
    return new NatsTopologyError(channel, stream, errorMessage(error), error);
  }
}

function isApiError(error: unknown, code: number): boolean {
  return error instanceof JetStreamApiError && error.code === code;
}
