import { hostname } from 'node:os';
import { JetStreamApiError, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import type { NatsConnection } from './nats.client';
import { LEASE_FREE_SUBJECT_PREFIX, LEASE_SUBJECT_PREFIX, leaseSubject } from './nats.naming';

/** JetStream's answer to a publish whose expected last subject sequence is not the subject's. */
const WRONG_LAST_SEQUENCE = 10071;
/** JetStream's answer to a request about a message the stream does not hold. */
const NO_MESSAGE_FOUND = 10037;

/**
 * The leases of one partitioned channel's partitions, kept in JetStream: the lease of partition
 * `i` is the one message of subject `nseq-lease.<channel>.<i>` in the channel's lease stream
 * (`max_msgs_per_subject: 1`, `max_age` the lease time). Every write is a compare-and-set on the
 * subject's last sequence (`Nats-Expected-Last-Subject-Sequence`):
 *
 * - **claim**: expects 0, so it succeeds only while nobody holds the lease (no message: never
 *   written, released, or expired by `max_age`);
 * - **renew**: expects the sequence of the holder's last write, so it fails once the lease has
 *   lapsed or another subscriber holds it;
 * - a write refused while the subject's last message is the writer's own (a write whose PubAck
 *   was lost) is made again on that message's sequence; the subscription claims again a
 *   partition whose claim got no answer, so that such a lease is taken back at once;
 * - **release**: deletes the holder's own last write (by sequence: never another's), then
 *   tells the channel's other subscribers on the core subject `nseq-lease-free.<channel>`.
 */
export class NatsPartitionLeases {
  private readonly subjectPrefix: string;
  private readonly record: string;

  constructor(
    private readonly settings: {
      readonly channel: string;
      /** The channel's lease stream. */
      readonly stream: string;
      /** Who claims, unique to this subscription: written in the lease. */
      readonly owner: string;
      readonly js: JetStreamClient;
      readonly jsm: () => Promise<JetStreamManager>;
      readonly connection: NatsConnection;
      /** How long one write waits for its PubAck. */
      readonly timeoutMs: number;
    },
  ) {
    this.subjectPrefix = `${LEASE_SUBJECT_PREFIX}${settings.channel}.`;
    this.record = JSON.stringify({ owner: settings.owner, host: hostname(), pid: process.pid });
  }

  /** Claims partition `index`: its lease's sequence, or undefined when another holds it. */
  claim(index: number): Promise<number | undefined> {
    return this.write(index, 0);
  }

  /** Renews a lease written at `sequence`: its new sequence, or undefined when it was lost. */
  renew(index: number, sequence: number): Promise<number | undefined> {
    return this.write(index, sequence);
  }

  /** Gives up a lease written at `sequence`, and tells the others it is free. */
  async release(sequence: number): Promise<void> {
    const jsm = await this.settings.jsm();
    await jsm.streams.deleteMessage(this.settings.stream, sequence, false).catch((error) => {
      // Lapsed already: nothing of ours to delete.
      if (!(error instanceof JetStreamApiError && error.code === NO_MESSAGE_FOUND)) throw error;
    });
    this.settings.connection.publish(`${LEASE_FREE_SUBJECT_PREFIX}${this.settings.channel}`);
  }

  /** The partitions whose lease someone holds now. */
  async held(): Promise<ReadonlySet<number>> {
    const jsm = await this.settings.jsm();
    const info = await jsm.streams.info(this.settings.stream, {
      subjects_filter: `${this.subjectPrefix}*`,
    });
    const held = new Set<number>();
    for (const subject of Object.keys(info.state.subjects ?? {})) {
      held.add(Number(subject.slice(this.subjectPrefix.length)));
    }
    return held;
  }

  /** Calls `listener` whenever a subscriber releases a lease of the channel. */
  onReleased(listener: () => void): () => void {
    const subscription = this.settings.connection.subscribe(
      `${LEASE_FREE_SUBJECT_PREFIX}${this.settings.channel}`,
      { callback: () => listener() },
    );
    return () => subscription.unsubscribe();
  }

  private async write(index: number, expected: number, again = true): Promise<number | undefined> {
    try {
      const ack = await this.settings.js.publish(
        leaseSubject(this.settings.channel, index),
        this.record,
        {
          expect: { lastSubjectSequence: expected, streamName: this.settings.stream },
          timeout: this.settings.timeoutMs,
        },
      );
      return ack.seq;
    } catch (error) {
      if (!(error instanceof JetStreamApiError && error.code === WRONG_LAST_SEQUENCE)) throw error;
      const last = again ? await this.last(index) : undefined;
      return last?.owner === this.settings.owner
        ? this.write(index, last.sequence, false)
        : undefined;
    }
  }

  /**
   * The lease of partition `index` as the stream holds it, if any. Rejects when the stream does
   * not answer: taken for "not ours", a lease of this subscriber's own (written by a write whose
   * PubAck was lost) would be left to lapse, and the partition idle until then.
   */
  private async last(index: number): Promise<{ sequence: number; owner?: string } | undefined> {
    const jsm = await this.settings.jsm();
    // Null when the subject holds no message.
    const stored = await jsm.streams.getMessage(this.settings.stream, {
      last_by_subj: leaseSubject(this.settings.channel, index),
    });
    if (!stored) return undefined;
    let owner: string | undefined;
    try {
      owner = stored.json<{ owner?: string }>().owner;
    } catch {
      owner = undefined; // not a lease of ours
    }
    return { sequence: stored.seq, owner };
  }
}
