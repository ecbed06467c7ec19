import type { Logger } from '@nestjs/common';
import { MAX_TIMER_MS } from '../../../core/async';
import { errorMessage } from '../../../core/errors/caught';
import type { Subscription } from '../../../ports/transport.port';
import type { NatsPartitionLeases } from './nats.partition-leases';
import type { NatsSubscription } from './nats.subscription';
import { leaseClock, leaseLater, leaseMsLeft, type LeaseInstant } from '../../../core/lease-clock';

/**
 * A lease is trusted for this share of the lease time after the write that took or renewed it
 * was sent: the server counts its `max_age` from when it stored the write, later than that.
 */
const TRUSTED_SHARE = 0.9;
/**
 * Renewed once a quarter of the lease time has passed, checked every tenth on a timer of its own
 * (claims never hold a renewal up): a renewal goes out by 35% of it, unless the previous ones
 * still wait for their answers, while in-progress acks may still go out (they stop at 40%: the
 * lease is trusted for 90% of its time, `ack_wait` is at most half), so that they keep coming
 * while renewals are stored. A renewal that fails is tried again at every check until the lease
 * is no longer trusted.
 */
const RENEW_SHARE = 1 / 4;
/** Free partitions are looked for every tenth of the lease time, and whenever one is released. */
const CLAIM_SHARE = 1 / 10;

export interface NatsPartitionedSubscriptionSettings {
  readonly channel: string;
  readonly count: number;
  /** Declares what the subscription needs (cached); resolves to the lease time. */
  readonly ensure: () => Promise<number>;
  /** Forgets the declarations, after a failure that may mean they are gone. */
  readonly forget: () => void;
  readonly leases: NatsPartitionLeases;
  /**
   * Starts pulling partition `index`; `mayHold` tells whether its lease is still trusted,
   * `mayExtend` whether in-progress acks keeping its messages `ackWaitMs` more may go out.
   */
  readonly open: (
    index: number,
    mayHold: () => boolean,
    mayExtend: (ackWaitMs: number) => boolean,
  ) => NatsSubscription;
  readonly logger: Logger;
  readonly onClosed: (subscription: NatsPartitionedSubscription) => void;
}

interface OwnedPartition {
  readonly index: number;
  /** Sequence of this subscriber's last write of the lease. */
  sequence: number;
  /** When that write was sent (lease times count on both clocks: see core/lease-clock). */
  writtenAt: LeaseInstant;
  subscription?: NatsSubscription;
  /** Fires as the lease stops being trusted: its subscription is abandoned then. */
  distrust?: NodeJS.Timeout;
}

/**
 * A subscription to every partition of a partitioned channel, pulling only from the partitions
 * whose lease it holds (see {@link NatsPartitionLeases}):
 *
 * - every tenth of the lease time, and at once when another subscriber releases one, it claims
 *   the partitions nobody holds, and starts pulling from each it gets;
 * - every tenth of the lease time, it renews each lease a quarter of the lease time old, whatever
 *   a claim is waiting for. A lease it could not renew for 90% of the
 *   lease time (a lost connection, a paused process) is no longer trusted: from that moment (a
 *   timer per lease) no in-progress acks go out for its messages, verdicts on them are ignored
 *   (and logged), and the partition's pulling stops without handing them back, since
 *   another subscriber may have them by then (the server redelivers them after `ack_wait`). A
 *   renewal refused because the lease is another's stops the partition the same way, handing its
 *   messages back at once when the lease was still trusted;
 * - on close it stops every partition, handing its unsettled messages back (`nak`), then
 *   releases the leases, so that another subscriber takes over at once.
 */
export class NatsPartitionedSubscription implements Subscription {
  readonly channel: string;

  private readonly owned = new Map<number, OwnedPartition>();
  /**
   * Partitions let go because their lease was no longer trusted, with the sequence of the last
   * write: renewed first when claiming, so that after a short outage the lease (still this
   * subscriber's, unless it lapsed) is taken back without waiting for it to lapse. A claim that
   * got no answer is kept here with sequence 0: claimed again, even while the partition looks
   * held, since the holder may be this subscriber.
   */
  private readonly lapsed = new Map<number, number>();
  private leaseMs = 0;
  private timer?: NodeJS.Timeout;
  /**
   * Renews the leases due and lets go of untrusted ones, every tenth of the lease time, even
   * while a tick waits on an unanswered claim.
   */
  private fence?: NodeJS.Timeout;
  private renewing?: Promise<void>;
  /** Partitions whose renewal waits for its answer: not claimed again meanwhile. */
  private readonly writing = new Set<number>();
  private ticking?: Promise<void>;
  private again = false;
  private unlisten?: () => void;
  /** The loops whose last attempt failed: each logs its failure once, and its recovery. */
  private readonly failing = new Set<'claims' | 'renewals'>();
  private closed = false;
  private closing?: Promise<void>;

  constructor(private readonly settings: NatsPartitionedSubscriptionSettings) {
    this.channel = settings.channel;
  }

  /** The partitions this subscriber holds now (a lease it trusts). */
  get partitions(): readonly number[] {
    return [...this.owned.values()]
      .filter((partition) => this.trusted(partition))
      .map((partition) => partition.index)
      .sort((a, b) => a - b);
  }

  /** Starts: resolves once it has tried to claim every free partition. */
  async start(): Promise<void> {
    this.unlisten = this.settings.leases.onReleased(() => this.wake());
    await this.tick();
  }

  /** Starts the fence once the lease time is known, before the first claim. */
  private startFence(): void {
    // Closed meanwhile: shutdown() found no fence to clear.
    if (this.fence || this.closed) return;
    this.fence = setInterval(
      () => {
        this.letGoUntrusted();
        this.renewDue();
      },
      Math.max(50, Math.floor(this.leaseMs * CLAIM_SHARE)),
    );
  }

  /**
   * Lets go of `partition` as its lease stops being trusted, to the moment: its subscription's
   * messages are abandoned then (their `abandoned` signal aborted), so that a verdict given
   * later, which the subscription ignores, is not counted by the module either.
   */
  private watchTrust(partition: OwnedPartition): void {
    clearTimeout(partition.distrust);
    if (this.closed || this.owned.get(partition.index) !== partition) return;
    const leftMs = this.trustLeftMs(partition);
    partition.distrust = setTimeout(
      () => {
        // A timer may fire a little early: then it is set again for what is left.
        if (this.trusted(partition)) this.watchTrust(partition);
        else this.stop(partition, false);
      },
      Math.min(MAX_TIMER_MS, Math.max(1, Math.ceil(leftMs))),
    );
  }

  /** Stops the partitions whose lease could not be renewed in time, without handing back. */
  private letGoUntrusted(): void {
    for (const partition of this.owned.values()) {
      if (!this.trusted(partition)) this.stop(partition, false);
    }
  }

  close(): Promise<void> {
    this.closing ??= this.shutdown();
    return this.closing;
  }

  private async shutdown(): Promise<void> {
    this.closed = true;
    clearTimeout(this.timer);
    clearInterval(this.fence);
    this.unlisten?.();
    await this.ticking;
    await this.renewing;
    await Promise.all(
      [...this.owned.values()].map(async (partition) => {
        clearTimeout(partition.distrust);
        this.owned.delete(partition.index);
        await partition.subscription?.close();
        await this.settings.leases
          .release(partition.sequence)
          .catch((error: unknown) =>
            this.settings.logger.warn(
              `releasing partition ${partition.index} of ${this.channel}: ${errorMessage(error)}`,
            ),
          );
      }),
    );
    this.settings.onClosed(this);
  }

  /** Runs a tick now, or right after the one running. */
  private wake(): void {
    if (this.closed) return;
    if (this.ticking) {
      this.again = true;
      return;
    }
    clearTimeout(this.timer);
    void this.tick();
  }

  private async tick(): Promise<void> {
    const run = (async () => {
      try {
        this.leaseMs = await this.settings.ensure();
        this.startFence();
        await this.claim();
        this.succeeded('claims');
      } catch (error) {
        // Closed meanwhile: a claim refused by the closing transport is no failure to retry.
        if (!this.closed) this.failed('claims', error);
      } finally {
        this.letGoUntrusted();
      }
    })();
    this.ticking = run;
    await run;
    this.ticking = undefined;
    if (this.closed) return;
    if (this.again) {
      this.again = false;
      return this.tick();
    }
    const every = Math.max(50, Math.floor((this.leaseMs || 1_000) * CLAIM_SHARE));
    this.timer = setTimeout(() => void this.tick(), every);
  }

  /** Renews the leases due, unless the previous renewals still wait for their answers. */
  private renewDue(): void {
    if (this.closed || this.renewing) return;
    this.renewing = this.renew()
      .then(
        (sent) => {
          // Nothing sent says nothing of the server.
          if (sent > 0) this.succeeded('renewals');
        },
        (error: unknown) => {
          if (!this.closed) this.failed('renewals', error);
        },
      )
      .finally(() => {
        this.renewing = undefined;
        this.letGoUntrusted();
      });
  }

  private succeeded(loop: 'claims' | 'renewals'): void {
    if (this.failing.delete(loop)) {
      this.settings.logger.log(`partition leases of ${this.channel}: ${loop} resumed`);
    }
  }

  private failed(loop: 'claims' | 'renewals', error: unknown): void {
    if (!this.failing.has(loop)) {
      this.settings.logger.warn(
        `partition leases of ${this.channel}: ${loop} failed: ${errorMessage(error)}; trying again`,
      );
    }
    this.failing.add(loop);
    this.settings.forget();
  }

  /** Renews the leases due; resolves to the number of renewals sent. */
  private async renew(): Promise<number> {
    const renewals = [...this.owned.values()]
      .filter(
        (partition) =>
          leaseMsLeft(leaseLater(partition.writtenAt, this.leaseMs * RENEW_SHARE)) <= 0,
      )
      .map(async (partition) => {
        const sentAt = leaseClock();
        this.writing.add(partition.index);
        let sequence: number | undefined;
        try {
          sequence = await this.settings.leases.renew(partition.index, partition.sequence);
        } finally {
          this.writing.delete(partition.index);
        }
        if (this.owned.get(partition.index) !== partition) {
          // Let go meanwhile (no longer trusted): the lease, if still this subscriber's, is
          // taken back on the sequence this write stored.
          if (sequence !== undefined && this.lapsed.has(partition.index)) {
            this.lapsed.set(partition.index, sequence);
          }
          return;
        }
        if (sequence === undefined) {
          this.settings.logger.warn(
            `lost partition ${partition.index} of ${this.channel}: its lease is another's`,
          );
          this.stop(partition, this.trusted(partition));
          return;
        }
        if (!this.trusted(partition)) {
          // Answered after the lease stopped being trusted (a wall clock stepped forward fires
          // neither the distrust timer nor the fence): another may have claimed it meanwhile, so
          // its subscription is let go first; the next claim takes the lease back on this write.
          this.stop(partition, false);
          this.lapsed.set(partition.index, sequence);
          return;
        }
        partition.sequence = sequence;
        partition.writtenAt = sentAt;
        this.watchTrust(partition);
      });
    const failed = (await Promise.allSettled(renewals)).find(
      (outcome): outcome is PromiseRejectedResult => outcome.status === 'rejected',
    );
    if (failed) throw failed.reason;
    return renewals.length;
  }

  private async claim(): Promise<void> {
    if (this.closed || this.owned.size === this.settings.count) return;
    const held = await this.settings.leases.held();
    for (let index = 0; index < this.settings.count; index++) {
      if (this.closed) return;
      if (this.owned.has(index) || this.writing.has(index)) continue;
      const previous = this.lapsed.get(index);
      if (held.has(index) && previous === undefined) continue;
      const sentAt = leaseClock();
      let sequence: number | undefined;
      try {
        sequence =
          previous === undefined
            ? await this.settings.leases.claim(index)
            : await this.settings.leases.renew(index, previous);
      } catch (error) {
        // No answer (a lost PubAck, a timeout): the claim may be stored, the lease this
        // subscriber's own. The next tick claims again although the partition then looks held:
        // refused on a lease of its own, the claim is made again on it (NatsPartitionLeases), so
        // the partition is not left idle until that lease lapses.
        if (previous === undefined) this.lapsed.set(index, 0);
        throw error;
      }
      this.lapsed.delete(index);
      if (sequence === undefined) continue;
      const partition: OwnedPartition = { index, sequence, writtenAt: sentAt };
      this.owned.set(index, partition);
      this.watchTrust(partition);
      try {
        partition.subscription = this.settings.open(
          index,
          () => !this.closed && this.owned.get(index) === partition && this.trusted(partition),
          (ackWaitMs) => this.extendable(partition, ackWaitMs),
        );
      } catch (error) {
        // Nothing pulls the partition (a closed connection, say): its lease is let go at once
        // rather than renewed with nobody reading it.
        clearTimeout(partition.distrust);
        this.owned.delete(index);
        await this.settings.leases.release(sequence).catch(() => undefined);
        throw error;
      }
    }
  }

  private trusted(partition: OwnedPartition): boolean {
    return this.trustLeftMs(partition) > 0;
  }

  /** How long the partition's lease is still trusted, by the clock that leaves the less. */
  private trustLeftMs(partition: OwnedPartition): number {
    return leaseMsLeft(leaseLater(partition.writtenAt, this.leaseMs * TRUSTED_SHARE));
  }

  /**
   * Whether an in-progress ack sent now keeps the partition's messages no later than its lease
   * could lapse: the server delivers them again `ackWaitMs` after the last one, and another
   * subscriber may claim the partition once the lease lapses. Later ones would let that
   * subscriber pull messages published meanwhile before them, out of order.
   */
  private extendable(partition: OwnedPartition, ackWaitMs: number): boolean {
    return this.trustLeftMs(partition) > ackWaitMs;
  }

  /** Stops pulling a partition whose lease is gone: handing its messages back, or not. */
  private stop(partition: OwnedPartition, handBack: boolean): void {
    if (this.owned.get(partition.index) !== partition) return;
    clearTimeout(partition.distrust);
    this.owned.delete(partition.index);
    if (!handBack) this.lapsed.set(partition.index, partition.sequence);
    const subscription = partition.subscription;
    if (!subscription) return;
    void (handBack ? subscription.close() : subscription.abandon()).catch((error: unknown) =>
      this.settings.logger.warn(
        `stopping partition ${partition.index} of ${this.channel}: ${errorMessage(error)}`,
      ),
    );
  }
}
