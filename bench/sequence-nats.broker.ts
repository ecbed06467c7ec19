/**
 * bench:sequence on NATS JetStream (`BENCH_TRANSPORT=nats`), the producer side: (a) plain
 * `@nats-io/jetstream`, each fragment a `js.publish` awaiting its PubAck, `inFlight` at once, to
 * a stream declared as the transport declares its own (file storage, work-queue retention) with
 * a durable pull consumer; (b) the module's producer over a `NatsTransport` of its own. The raw
 * consumer is sequence-nats.raw-consumer.ts.
 */
import {
  AckPolicy,
  jetstream,
  jetstreamManager,
  RetentionPolicy,
  StorageType,
  type JetStreamManager,
} from '@nats-io/jetstream';
import { NatsTransport } from 'nest-sequence/nats';
import type { Transport } from 'nest-sequence';
import {
  connectNats,
  type NatsConnection,
} from '../libs/sequence/src/adapters/transports/nats/nats.client';
import {
  leaseStreamName,
  partitionStreamName,
  streamName,
} from '../libs/sequence/src/adapters/transports/nats/nats.naming';
import { onCleanup } from './harness/cleanup';
import { progress } from './harness/log';
import type { BenchBroker } from './sequence-rabbitmq.brokers';
import { RAW_NATS_CONSUMER, rawNatsStream } from './sequence-nats.raw-consumer';

/** The transport's stream prefix (its default): the module path's streams are `NSEQ_…`. */
const MODULE_STREAM_PREFIX = 'NSEQ_';
/** How long a drained stream may take to see the last acks, which are not awaited. */
const DRAIN_WAIT_MS = 5_000;

export class NatsBenchBroker implements BenchBroker {
  readonly transport = 'nats';
  readonly bench = 'sequence-nats';
  readonly server = 'nats';
  private readonly streams = new Set<string>();

  private constructor(
    private readonly url: string,
    private readonly connection: NatsConnection,
    private readonly jsm: JetStreamManager,
  ) {
    onCleanup('delete the streams of the run', () => this.sweep());
  }

  /** Connects (closed, and the run's streams deleted, when the benchmark ends). */
  static async connect(url: string): Promise<NatsBenchBroker> {
    const connection = await connectNats({ servers: url });
    const jsm = await jetstreamManager(connection);
    return new NatsBenchBroker(url, connection, jsm);
  }

  async declareRaw(subject: string): Promise<void> {
    const stream = rawNatsStream(subject);
    this.streams.add(stream);
    await this.jsm.streams.add({
      name: stream,
      subjects: [subject],
      retention: RetentionPolicy.Workqueue,
      storage: StorageType.File,
    });
    await this.jsm.consumers.add(stream, {
      durable_name: RAW_NATS_CONSUMER,
      ack_policy: AckPolicy.Explicit,
      max_ack_pending: -1,
    });
  }

  trackModule(channel: string, partitions = 0): void {
    for (const each of [channel, `${channel}.dlq`]) {
      this.streams.add(streamName(MODULE_STREAM_PREFIX, each));
    }
    if (partitions > 0) {
      this.streams.add(partitionStreamName(MODULE_STREAM_PREFIX, channel));
      this.streams.add(leaseStreamName(MODULE_STREAM_PREFIX, channel));
    }
  }

  async publishRaw(subject: string, fragments: Iterable<Buffer>, inFlight: number): Promise<void> {
    const js = jetstream(this.connection);
    const pending = new Set<Promise<unknown>>();
    for (const body of fragments) {
      const acked: Promise<unknown> = js
        .publish(subject, body)
        .finally(() => pending.delete(acked));
      pending.add(acked);
      if (pending.size >= inFlight) await Promise.race(pending);
    }
    await Promise.all(pending);
  }

  async assertDrained(subject: string, what: string, partitions = 0): Promise<void> {
    const stream = this.streams.has(rawNatsStream(subject))
      ? rawNatsStream(subject)
      : streamName(MODULE_STREAM_PREFIX, subject);
    await this.drained(stream, what);
    if (partitions > 0)
      await this.drained(partitionStreamName(MODULE_STREAM_PREFIX, subject), what);
  }

  /** Waits until `stream` holds nothing (a stream never declared counts as empty). */
  private async drained(stream: string, what: string): Promise<void> {
    const deadline = Date.now() + DRAIN_WAIT_MS;
    for (;;) {
      const info = await this.jsm.streams.info(stream).catch((error: unknown) => {
        if (/stream not found/i.test(String(error))) return undefined;
        throw error;
      });
      const messages = info?.state.messages ?? 0;
      if (messages === 0) return;
      if (Date.now() > deadline) {
        throw new Error(`${messages} message(s) left in ${stream} (${what})`);
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }

  connectTransport(unsafeSocketTricks: boolean): Promise<Transport> {
    return NatsTransport.connect({ servers: this.url }, { unsafeSocketTricks });
  }

  private async sweep(): Promise<void> {
    try {
      for (const stream of this.streams) {
        await this.jsm.streams.delete(stream).catch(() => undefined);
      }
      progress(`deleted ${this.streams.size} stream(s) of the run`);
    } finally {
      await this.connection.close().catch(() => undefined);
    }
  }
}
