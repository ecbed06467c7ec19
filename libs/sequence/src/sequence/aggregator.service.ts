import { randomUUID } from 'node:crypto';
import { Inject, Injectable, Logger } from '@nestjs/common';
import { splitDeathReason, type RejectionCode } from '../core/errors/rejection-code';
import { ConsumerHost } from '../kernel/consumer.host';
import { deadLetterReasonLabel } from '../kernel/dead-letter.metrics';
import { SequenceMetrics } from './sequence.metrics';
import type { AcceptResult, CompleteSequence, SequenceStore } from '../ports/sequence-store.port';
import type { Disposition, InboundMessage, Transport } from '../ports/transport.port';
import { RESOLVED_OPTIONS, BOUNDED_SEQUENCE_STORE, SEQUENCE_TRANSPORT } from '../kernel/tokens';
import {
  FRAGMENT_PARKING,
  type FragmentParking,
  type SequenceReassembler,
  type TakenFragment,
} from '../kernel/pattern-contracts';
import type { ResolvedOptions } from '../options/resolved-options';
import {
  fragmentPrefetch,
  resolveSequenceConsumer,
  sequenceLimits,
} from '../options/resolve-sequence';
import type { SequenceConsumerOptions } from '../options/sequence.options';
import type { LifecyclePart } from '../kernel/sequence.lifecycle';
import type { SequenceConsumer, SequenceHandlerFn } from './sequence-consumer';
import { claimCheckMarking } from '../core/claim-check-headers';
import { IntakeDigests } from './intake-digests';
import { errorMessage } from '../core/errors/caught';
import { leaseClock, type LeaseInstant } from '../core/lease-clock';
import { SequenceDelivery } from './sequence-delivery';
import { FragmentChecks, isRefusal } from './fragment-checks';
import { SequenceTracing } from './sequence.tracing';
import { SequenceEvents } from '../kernel/lifecycle-events';
import { SequenceLifecycle, type FragmentIds } from './sequence.events';
import { parseFragmentHeaders, type FragmentHeaders } from '../core/headers';
import { MalformedFragmentError } from '../core/errors/malformed-fragment.error';
import { PAYLOAD_STORE_UNAVAILABLE, storeRequeuesSpent } from '../kernel/store-requeues';

export type { SequenceConsumer, SequenceHandlerFn } from './sequence-consumer';

const ACK: Disposition = { action: 'ack' };

/** What `intake` learnt of a fragment, for `receive` to act on once the disposition is known. */
interface FragmentIntake {
  /** Its body was parked in the payload store (sent `via: 'claim-check'`). */
  parked?: TakenFragment;
  /** When its sequence began before the store saw it (`AcceptContext.startedAt`). */
  readonly startedAt?: number;
}

/** Sequences at once whose in-order arrivals are hashed as they come (see IntakeDigests). */
const INTAKE_DIGEST_CAPACITY = 1024;

/**
 * Consumer side of Message Sequence: validates each fragment, stores it, and when a sequence is
 * complete verifies it and calls the consumer's handler, once. `@SequencedHandler` methods are
 * wired to it by the module; use it directly when you consume with your own subscriber:
 *
 * @example
 * const consumer = aggregator.createConsumer('scans', (payload) => archive(payload.stream()));
 * myBroker.onMessage(async (msg) => settle(msg, await aggregator.receive(msg, consumer)));
 */
@Injectable()
export class AggregatorService implements SequenceReassembler, LifecyclePart {
  private readonly logger = new Logger(AggregatorService.name);
  /**
   * Dead-letter channel of every consumer created here, for records published on its behalf; a
   * reply channel has none (and a process opens new ones for as long as it runs).
   */
  private readonly deadLetterChannels = new Map<string, string>();
  private readonly delivery: SequenceDelivery;
  private readonly digests = new IntakeDigests(INTAKE_DIGEST_CAPACITY);
  private readonly traces: SequenceTracing;
  private readonly lifecycle: SequenceLifecycle;
  private readonly checks: FragmentChecks;

  constructor(
    @Inject(BOUNDED_SEQUENCE_STORE) private readonly store: SequenceStore,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    private readonly metrics: SequenceMetrics,
    @Inject(FRAGMENT_PARKING) private readonly parking: FragmentParking,
    events: SequenceEvents,
    host: ConsumerHost,
  ) {
    this.lifecycle = new SequenceLifecycle(events);
    this.delivery = new SequenceDelivery(
      store,
      options,
      metrics,
      this.logger,
      this.lifecycle,
      (channel) => host.stoppingOf(channel),
    );
    this.traces = new SequenceTracing(options.tracing);
    this.checks = new FragmentChecks(metrics, this.lifecycle, this.logger);
  }

  /** After the shutdown's drain: a handled sequence's outcome is no longer retried. */
  async stop(): Promise<void> {
    this.delivery.stop();
  }

  /** Binds a handler to a channel, validating its option overrides. */
  createConsumer(
    channel: string,
    handler: SequenceHandlerFn,
    overrides: SequenceConsumerOptions = {},
  ): SequenceConsumer {
    const where = `sequence consumer of ${channel}`;
    const resolved = resolveSequenceConsumer(where, overrides, this.options);
    const options = { ...resolved, prefetch: fragmentPrefetch(resolved) };
    if (options.deadLetterChannel && this.transport.isReplyChannel?.(channel) !== true) {
      this.deadLetterChannels.set(channel, options.deadLetterChannel);
    }
    return { channel, handler, options };
  }

  /**
   * Where dead-letters of `channel` go: its consumer's `deadLetterChannel` when it consumes here,
   * else the module's `sequence.deadLetterChannel` (an instance that sweeps a channel it does not
   * consume), else the transport's own naming (`<channel>.dlq` unless configured otherwise).
   */
  deadLetterChannelOf(channel: string): string {
    return (
      this.deadLetterChannels.get(channel) ??
      this.options.sequence.consumer.deadLetterChannel ??
      this.transport.deadLetterChannel(channel)
    );
  }

  /**
   * Takes one fragment and says what to do with its message. Never throws: bad input becomes a
   * `dead-letter` with a reason, an unreachable store a delayed `requeue`. A fragment is acked only
   * once it is stored (or known to be a duplicate); the fragment that completes a sequence is acked
   * only after the handler succeeded. `startedAt`: when the sequence began before the store saw it
   * (see `AcceptContext.startedAt`).
   */
  receive(
    message: InboundMessage,
    consumer: SequenceConsumer,
    startedAt?: number,
  ): Promise<Disposition> {
    return this.traces.receive(message, consumer.channel, () =>
      this.take(message, consumer, startedAt),
    );
  }

  private async take(
    message: InboundMessage,
    consumer: SequenceConsumer,
    startedAt: number | undefined,
  ): Promise<Disposition> {
    const taken: FragmentIntake = { startedAt };
    try {
      const disposition = await this.intake(message, consumer, taken);
      // A fragment sent via claim check: its bytes are in the sequence store and its message is
      // about to be acked, so the parked copy has served its purpose. Not earlier: a message
      // redelivered before its ack (a crash mid-handler) still needs its body.
      if (taken.parked && disposition.action === 'ack') {
        void taken.parked.release();
      }
      return disposition;
    } catch (error) {
      // Only a bug can get here (every expected failure has its disposition): keep the message.
      this.logger.error(
        `${consumer.channel}: unexpected error taking a fragment; requeued: ${errorMessage(error)}`,
      );
      return this.requeue('unexpected error');
    }
  }

  private async intake(
    message: InboundMessage,
    consumer: SequenceConsumer,
    taken: FragmentIntake,
  ): Promise<Disposition> {
    const { channel, options } = consumer;
    const received: unknown = message.body;
    if (!Buffer.isBuffer(received)) {
      return this.rejectFragment(channel, 'malformed-header', 'the message body is not binary');
    }
    let body = received;
    const marking = claimCheckMarking(toHeaderRecord(message.headers));
    if (marking.via === 'unrecognised') {
      return this.rejectFragment(channel, 'malformed-header', marking.problem);
    }
    if (marking.via === 'ticket') {
      const headers = toHeaderRecord(message.headers);
      // The ticket is taken only for the fragment its headers name: they are read first.
      const ids = this.fragmentIdsOf(channel, headers);
      if ('action' in ids) return ids;
      const resolved = await this.resolveParkedBody(
        channel,
        received,
        headers,
        ids,
        options.maxFragmentBytes,
      );
      if ('gone' in resolved) return this.parkedBodyGone(channel, message, resolved);
      if ('action' in resolved) return resolved;
      ({ body, parked: taken.parked } = resolved);
    }
    const fragment = this.checks.check(channel, body, toHeaderRecord(message.headers), options);
    if (isRefusal(fragment)) return fragment;
    const { sequenceId, position } = fragment;

    // One lease token per delivery: two deliveries of one sequence, even in this process, are
    // two different holders.
    const leaseToken = `${this.options.consumerId}:${randomUUID()}`;
    // A completion lease the accept grants runs from when it was sent.
    const sentAt = leaseClock();
    let result: AcceptResult;
    try {
      const accepting = this.store.accept(
        { ...fragment, scope: channel, body },
        {
          now: Date.now(),
          consumerId: leaseToken,
          leaseMs: this.options.tuning.leaseMs,
          expiry: options.timeout,
          startedAt: taken.startedAt,
          limits: sequenceLimits(options, this.options.sequence),
          retentionMs: this.options.sequence.retentionMs,
        },
      );
      this.digests.follow(
        channel,
        sequenceId,
        position,
        body,
        // A copy taking over a complete sequence stored nothing (the body held at its position
        // may be another): it must not join the digest, and a store that does not say is not
        // trusted to have stored it.
        accepting.then(
          (accepted) =>
            accepted.status === 'stored' ||
            (accepted.status === 'complete' && accepted.stored === true),
          () => false,
        ),
      );
      result = await accepting;
    } catch (error) {
      this.logger.warn(
        `${this.store.name} store could not take sequence ${sequenceId} fragment ${position} ` +
          `on ${channel}; requeued: ${errorMessage(error)}`,
      );
      // A timed-out accept may still run in the store later (a hung server resuming) and grant
      // the completion lease to this delivery, which is gone: give that lease back, behind it on
      // the same connection, so the redelivered fragment need not wait for it to lapse.
      void this.store
        .releaseLease({ scope: channel, sequenceId }, leaseToken, Date.now())
        .catch(() => undefined);
      return this.requeue('store unavailable');
    }

    switch (result.status) {
      case 'stored':
        if (result.opened) this.metrics.sequenceStarted(channel);
        if (result.opened) this.lifecycle.started(channel, fragment);
        this.lifecycle.fragmentAccepted(channel, fragment, body.length);
        return ACK;
      case 'duplicate':
        return this.duplicate(channel, fragment);
      case 'in-progress':
        return this.requeue(`sequence ${sequenceId} is being delivered`);
      case 'backpressure':
        this.metrics.backpressured(channel, result.limit);
        return this.requeue(`${result.limit} reached`);
      case 'finished':
        if (result.outcome === 'completed') {
          return this.duplicate(channel, fragment);
        }
        if (result.outcome === 'failed' && result.reason) {
          // The fragment that completed a failed sequence is dead-lettered with the failure's
          // reason. When that dead letter could not be sent, the message came back and finds the
          // sequence failed: it goes to the dead-letter channel now, with the same reason. Which
          // fragment that was cannot be told, so late duplicates of the others go there too,
          // rather than the failure's only record being acked away. Counted and reported as a
          // rejected fragment, with the failure's code, as its dead letter says.
          const { code, detail } = splitDeathReason(result.reason);
          this.metrics.fragmentRejected(channel, deadLetterReasonLabel(result.reason));
          this.lifecycle.fragmentRejected(channel, code, detail, fragment);
          return { action: 'dead-letter', reason: result.reason };
        }
        if (result.outcome === 'failed') {
          return this.duplicate(channel, fragment);
        }
        return this.rejectFragment(
          channel,
          result.outcome === 'rejected' ? 'sequence-rejected' : 'sequence-expired',
          `sequence ${sequenceId} fragment ${position} arrived after the sequence was ` +
            `${result.outcome}${result.reason ? ` (${result.reason})` : ''}`,
          fragment,
        );
      case 'rejected':
        if (result.sequenceRejected) this.metrics.sequenceRejected(channel, result.code);
        if (result.sequenceRejected) {
          this.lifecycle.rejected(channel, sequenceId, result.code, result.detail);
        }
        return this.rejectFragment(
          channel,
          result.code,
          `sequence ${sequenceId} fragment ${position}: ${result.detail}`,
          fragment,
        );
      case 'complete':
        if (result.opened) this.metrics.sequenceStarted(channel);
        if (result.opened) this.lifecycle.started(channel, fragment);
        this.lifecycle.fragmentAccepted(channel, fragment, body.length);
        return this.deliver(message, consumer, result.sequence, leaseToken, sentAt);
    }
  }

  private async deliver(
    message: InboundMessage,
    consumer: SequenceConsumer,
    sequence: CompleteSequence,
    leaseToken: string,
    leaseGrantedAt: LeaseInstant,
  ): Promise<Disposition> {
    const { channel } = consumer;
    const digest = await this.digests.take(channel, sequence.sequenceId, sequence.fragments);
    return this.traces.process(channel, sequence, message, () =>
      this.delivery.deliver(sequence, consumer, leaseToken, leaseGrantedAt, digest),
    );
  }

  /**
   * The body of a fragment sent `via: 'claim-check'` (its message carries the ticket): its
   * ticket verified and its parked bytes read (and checked against the ticket). A refused ticket
   * is dead-lettered like a bad fragment; a payload store that cannot be read (an outage, a read
   * past `claimCheck.readTimeoutMs`) requeues it, as Claim Check does a ticket's message: once
   * requeued `tuning.maxStoreRequeues` times, it is dead-lettered `store-unavailable`.
   */
  private async resolveParkedBody(
    channel: string,
    ticketBody: Buffer,
    headers: Readonly<Record<string, unknown>>,
    fragment: FragmentIds,
    maxFragmentBytes: number,
  ): Promise<{ body: Buffer; parked: TakenFragment } | ParkedBodyGone | Disposition> {
    try {
      const taken = await this.parking.take(ticketBody, channel, fragment, maxFragmentBytes);
      if ('refused' in taken) {
        // Gone, or its ticket expired: perhaps taken already by a copy of this message (see
        // parkedBodyGone).
        if (taken.refused === 'claim-check-not-found' || taken.expiredOnly) {
          return { gone: taken.detail, code: taken.refused, expired: taken.expiredOnly === true };
        }
        return this.rejectFragment(channel, taken.refused, taken.detail);
      }
      return { body: taken.body, parked: taken };
    } catch (error) {
      const cause = errorMessage(error);
      const { maxStoreRequeues } = this.options.tuning;
      const spent = storeRequeuesSpent(headers, PAYLOAD_STORE_UNAVAILABLE, cause, maxStoreRequeues);
      if (spent !== undefined) {
        return this.rejectFragment(channel, 'store-unavailable', spent, fragmentIdsIn(headers));
      }
      this.logger.warn(`${channel}: could not read a parked fragment body; requeued: ${cause}`);
      return this.requeue(PAYLOAD_STORE_UNAVAILABLE);
    }
  }

  /**
   * The sequence id and position a ticket message's headers name, or the dead letter of headers
   * that name none (as `FragmentChecks` refuses them), before the ticket's payload is read.
   */
  private fragmentIdsOf(
    channel: string,
    headers: Readonly<Record<string, unknown>>,
  ): FragmentIds | Disposition {
    try {
      const { sequenceId, position } = parseFragmentHeaders(headers);
      return { sequenceId, position };
    } catch (error) {
      const code = error instanceof MalformedFragmentError ? error.code : 'malformed-header';
      return this.rejectFragment(channel, code, errorMessage(error));
    }
  }

  /**
   * A fragment whose parked body is gone, or whose ticket expired (and passes every other check).
   * Its body is deleted once a copy of the message was stored and acked, so this is most often
   * the broker's duplicate of that copy (a publish retried after a lost confirm, a redelivery
   * after a lost ack, perhaps past the ticket's expiry): acked as one when the store has the
   * fragment, or has the sequence completed. Otherwise the body is lost, or its ticket no longer
   * valid: dead-lettered with its code.
   *
   * A copy whose ticket expired may also be the completing fragment itself, requeued while its
   * complete sequence waits to be delivered (a handler still at work, a consumer that crashed):
   * acked, it would leave nothing to start that delivery again. While a consumer holds the
   * sequence it is requeued, to be told apart once that one finishes; with nobody holding it, it
   * is dead-lettered.
   */
  private async parkedBodyGone(
    channel: string,
    message: InboundMessage,
    { gone: detail, code, expired }: ParkedBodyGone,
  ): Promise<Disposition> {
    let fragment: FragmentHeaders;
    try {
      fragment = parseFragmentHeaders(toHeaderRecord(message.headers));
    } catch {
      return this.rejectFragment(channel, code, detail);
    }
    let stored: StoredPosition;
    try {
      stored = await this.storeHas(channel, fragment);
    } catch (error) {
      this.logger.warn(
        `${channel}: could not ask the ${this.store.name} store about sequence ` +
          `${fragment.sequenceId}; requeued: ${errorMessage(error)}`,
      );
      return this.requeue('sequence store unavailable');
    }
    if (stored === 'has' || (stored !== 'lacks' && !expired)) {
      return this.duplicate(channel, fragment);
    }
    if (stored === 'delivering') {
      return this.requeue(`sequence ${fragment.sequenceId} is being delivered`);
    }
    return this.rejectFragment(channel, code, detail, fragment);
  }

  /**
   * Whether the store holds the fragment's position or completed its sequence (`has`), or holds
   * the position of a sequence complete but not yet delivered (`delivering` while a consumer
   * holds it, else `undelivered`).
   */
  private async storeHas(channel: string, fragment: FragmentHeaders): Promise<StoredPosition> {
    const ref = { scope: channel, sequenceId: fragment.sequenceId };
    const now = Date.now();
    const status = await this.store.status?.(ref, now);
    if (status?.state === 'finished') return status.outcome === 'completed' ? 'has' : 'lacks';
    if (status?.state === 'unknown') return 'lacks';
    const open = await this.store.inspect?.(ref, now);
    if (!open?.receivedPositions.includes(fragment.position)) return 'lacks';
    if (!open.complete) return 'has';
    return open.leaseHolder === undefined ? 'undelivered' : 'delivering';
  }

  /** A fragment already taken (or of a sequence already done): counted, reported and acked. */
  private duplicate(channel: string, fragment: FragmentIds): Disposition {
    this.metrics.duplicateFragment(channel);
    this.lifecycle.fragmentDuplicate(channel, fragment);
    return ACK;
  }

  private rejectFragment(
    channel: string,
    code: RejectionCode,
    detail: string,
    fragment?: FragmentIds,
  ): Disposition {
    return this.checks.reject(channel, code, detail, fragment);
  }

  private requeue(reason: string): Disposition {
    return { action: 'requeue', delayMs: this.options.tuning.backpressureDelayMs, reason };
  }
}

/** A parked fragment body that is gone, or whose ticket expired (`expired`), and why. */
interface ParkedBodyGone {
  readonly gone: string;
  readonly code: RejectionCode;
  readonly expired: boolean;
}

/** What the sequence store holds of a fragment's position (see `storeHas`). */
type StoredPosition = 'has' | 'lacks' | 'delivering' | 'undelivered';

/** The fragment's sequence id and position, when its headers are whole; else undefined. */
function fragmentIdsIn(headers: Readonly<Record<string, unknown>>): FragmentIds | undefined {
  try {
    const { sequenceId, position } = parseFragmentHeaders(headers);
    return { sequenceId, position };
  } catch {
    return undefined;
  }
}

/** Headers as an object, whatever the subscriber handed over (amqplib gives undefined for none). */
function toHeaderRecord(headers: unknown): Readonly<Record<string, unknown>> {
  return typeof headers === 'object' && headers !== null
    ? (headers as Record<string, unknown>)
    : {};
}
