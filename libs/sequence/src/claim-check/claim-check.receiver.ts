import { randomUUID } from 'node:crypto';
import { ConsumerHost } from '../kernel/consumer.host';
import { Inject, Injectable, Logger } from '@nestjs/common';
import type { ClaimTicket } from '../core/claim-ticket';
import { ClaimCheckNotFoundError } from '../core/errors/claim-check-not-found.error';
import { ClaimTicketAudienceError } from '../core/errors/claim-ticket-audience.error';
import { ClaimTicketInvalidError } from '../core/errors/claim-ticket-invalid.error';
import { HandlerTimeoutError } from '../core/errors/handler-timeout.error';
import { deathReason, type RejectionCode } from '../core/errors/rejection-code';
import { UnknownPayloadStoreError } from '../core/errors/unknown-payload-store.error';
import { ClaimCheckMetrics } from './claim-check.metrics';
import type { ClaimKey, ClaimOutcome } from '../ports/claim-ledger.port';
import {
  ClaimLedgerTimeoutError,
  type ClaimLedgerCall,
} from '../core/errors/claim-ledger-timeout.error';
import type { PayloadStore } from '../ports/payload-store.port';
import type { Disposition, InboundMessage, Transport } from '../ports/transport.port';
import {
  callHandlerWithRetry,
  handlerRejection,
  type HandlerOutcome,
} from '../kernel/handler-retry';
import { abortReason, retryWithin, withTimeout } from '../core/async';
import { leaseClock } from '../core/lease-clock';
import { errorMessage } from '../core/errors/caught';
import {
  SEQUENCE_REASSEMBLER,
  type ReassemblyConsumer,
  type SequenceReassembler,
} from '../kernel/pattern-contracts';
import {
  CLAIM_CHECK_STORES,
  RESOLVED_OPTIONS,
  SEQUENCE_TRANSPORT,
  type ClaimCheckStores,
} from '../kernel/tokens';
import type { ResolvedOptions } from '../options/resolved-options';
import type { SequenceLimitOptions } from '../options/sequence.options';
import { ClaimCheckHeader, claimCheckMarking, userHeadersOf } from '../core/claim-check-headers';
import { ClaimCheckTracing } from './claim-check.tracing';
import { PayloadParking } from './payload-parking';
import { claimLease } from './claim-lease';
import { carriesFragmentHeaders, headerText } from '../core/headers';
import type { ClaimCheckConsumer } from './claim-check-consumer';
import { ClaimedPayload } from './claimed-payload';
import { payloadReadRejection } from './payload-read-rejection';
import {
  CLAIM_LEDGER_UNAVAILABLE,
  PAYLOAD_STORE_UNAVAILABLE,
  storeRequeuesSpent,
} from '../kernel/store-requeues';

const ACK: Disposition = { action: 'ack' };

/** A requeue for a store failure, with what failed: stripped before the transport sees it. */
type StoreRequeue = Extract<Disposition, { action: 'requeue' }> & { readonly cause?: string };
const UNAVAILABLE: ReadonlySet<string> = new Set([
  PAYLOAD_STORE_UNAVAILABLE,
  CLAIM_LEDGER_UNAVAILABLE,
]);

/**
 * Consumer side of Claim Check: takes one message (a payload inline, or a ticket), and says what
 * to do with it. A ticket is verified (signature, expiry, issued for this channel, known store),
 * claimed in the ledger for this channel's consumer group (a duplicate is acked without running
 * the handler), and its payload handed to the handler, verified as it streams. Never throws: a refused message becomes
 * a `dead-letter` with a reason, an unreachable store or ledger a delayed `requeue`.
 */
@Injectable()
export class ClaimCheckReceiver {
  private readonly logger = new Logger('ClaimCheck');
  private readonly sequenceConsumers = new WeakMap<ClaimCheckConsumer, ReassemblyConsumer>();

  constructor(
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    @Inject(CLAIM_CHECK_STORES) private readonly stores: ClaimCheckStores,
    private readonly parking: PayloadParking,
    @Inject(SEQUENCE_REASSEMBLER) private readonly reassembler: SequenceReassembler,
    private readonly metrics: ClaimCheckMetrics,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    private readonly host: ConsumerHost,
  ) {
    this.traces = new ClaimCheckTracing(options.tracing);
  }

  private readonly traces: ClaimCheckTracing;

  async receive(message: InboundMessage, consumer: ClaimCheckConsumer): Promise<Disposition> {
    try {
      const disposition = await this.intake(message, consumer);
      return this.boundedRequeue(disposition, message, consumer.channel);
    } catch (error) {
      // Only a bug can get here (every expected failure has its disposition): keep the message.
      this.logger.error(
        `${consumer.channel}: unexpected error taking a message; requeued: ${errorMessage(error)}`,
      );
      return this.requeue('unexpected error');
    }
  }

  private async intake(
    message: InboundMessage,
    consumer: ClaimCheckConsumer,
  ): Promise<Disposition> {
    const { channel } = consumer;
    const headers: Readonly<Record<string, unknown>> = message.headers ?? {};
    const body: unknown = message.body;
    if (carriesFragmentHeaders(headers)) {
      // A Message Sequence fragment (`mode: 'auto'`): reassembled first, then handed over. Any
      // header of the fragment contract makes it one: the aggregator reads an id sent as bytes,
      // and dead-letters a fragment whose headers are incomplete (`malformed-header`).
      this.metrics.received(channel, 'sequence');
      return this.reassembler.receive(message, this.sequenceConsumerOf(consumer));
    }
    const marking = claimCheckMarking(headers);
    if (marking.via === 'unrecognised') {
      return this.reject(channel, 'malformed-header', marking.problem);
    }
    const viaTicket = marking.via === 'ticket';
    this.metrics.received(channel, marking.via);
    if (!Buffer.isBuffer(body)) {
      return this.reject(channel, 'claim-ticket-invalid', 'the message body is not binary');
    }
    if (!viaTicket) {
      return this.traces.inline(message, () => this.deliverInline(body, consumer, headers));
    }

    let ticket: ClaimTicket;
    let store: PayloadStore;
    try {
      // The audience is checked here, before the ledger or the store is touched: a ticket
      // replayed from another channel must not claim, read or (by retention) delete its payload.
      ({ ticket, store } = this.parking.resolveOn(channel, body));
    } catch (error) {
      if (error instanceof ClaimTicketInvalidError && error.reason === 'expired') {
        return this.expiredCopy(body, consumer, error);
      }
      if (error instanceof ClaimTicketInvalidError) {
        return this.reject(channel, 'claim-ticket-invalid', error.message);
      }
      if (error instanceof ClaimTicketAudienceError) {
        return this.reject(channel, 'wrong-audience', error.message);
      }
      if (error instanceof UnknownPayloadStoreError) {
        return this.reject(channel, 'unknown-payload-store', error.message);
      }
      throw error;
    }
    return this.traces.checkOut(channel, ticket, headers, () =>
      this.deliverTicket(ticket, store, headers, consumer),
    );
  }

  private async deliverInline(
    body: Buffer,
    consumer: ClaimCheckConsumer,
    headers: Readonly<Record<string, unknown>>,
  ): Promise<Disposition> {
    // Sent as a byte array (a Java producer's AMQP header), it is still the payload's type: read
    // as none, a JSON payload would reach a microservices `@Payload()` as a Buffer.
    const payload = ClaimedPayload.inline(
      body,
      userHeadersOf(headers),
      headerText(headers[ClaimCheckHeader.contentType]),
    );
    const outcome = await this.runHandler(payload, consumer, 'an inline payload');
    if (outcome.ok) return ACK;
    if (outcome.stopped) return this.requeue('shutting down');
    const { code, detail } = handlerRejection('an inline payload', outcome);
    return this.reject(consumer.channel, code, detail);
  }

  /**
   * Binds the channel's sequence consumer now rather than at its first fragment, so that this
   * instance's expiry sweeper records the channel's expired sequences (another instance's, in a
   * shared store) in the channel's own `deadLetterChannel`.
   */
  prepare(consumer: ClaimCheckConsumer): void {
    this.sequenceConsumerOf(consumer);
  }

  /** The reassembly consumer of a claim-check channel's sequences (made once per channel). */
  private sequenceConsumerOf(consumer: ClaimCheckConsumer): ReassemblyConsumer {
    let sequenceConsumer = this.sequenceConsumers.get(consumer);
    if (!sequenceConsumer) {
      const { timeout, maxSequenceBytes, maxFragments, maxFragmentBytes, maxHeaderBytes } =
        consumer.sequence;
      // Every limit the channel's `sequence` option takes: a new one fails to compile here.
      const limits: Required<SequenceLimitOptions> = {
        timeoutMs: timeout.ms,
        timeoutStrategy: timeout.strategy,
        maxSequenceBytes,
        maxFragments,
        maxFragmentBytes,
        maxHeaderBytes,
      };
      sequenceConsumer = this.reassembler.createConsumer(
        consumer.channel,
        (payload, context) => consumer.handler(ClaimedPayload.sequence(payload), context),
        {
          ...limits,
          handlerRetry: consumer.handlerRetry,
          handlerTimeoutMs: consumer.handlerTimeoutMs ?? false,
          prefetch: consumer.prefetch,
          // Where the channel's other refusals go (its expiry records too): never the module's
          // sequence.deadLetterChannel, which is Message Sequence's.
          deadLetterChannel:
            consumer.deadLetterChannel ?? this.transport.deadLetterChannel(consumer.channel),
        },
      );
      this.sequenceConsumers.set(consumer, sequenceConsumer);
    }
    return sequenceConsumer;
  }

  private async deliverTicket(
    ticket: ClaimTicket,
    store: PayloadStore,
    headers: Readonly<Record<string, unknown>>,
    consumer: ClaimCheckConsumer,
  ): Promise<Disposition> {
    const { channel } = consumer;
    const { ledger } = this.stores;
    const key: ClaimKey = { ticket: `${ticket.store}:${ticket.ref}`, group: channel };
    const holder = `${this.options.consumerId}:${randomUUID()}`;
    const claimedAt = leaseClock();
    try {
      const claim = await this.claimWithin(key, holder);
      if (claim === 'done') return await this.duplicate(ticket, store, key, holder, consumer);
      if (claim === 'busy') return this.requeue(`ticket ${key.ticket} is being handled`);
    } catch (error) {
      this.logger.warn(
        `${channel}: the ${ledger.name} claim ledger failed; requeued: ${errorMessage(error)}`,
      );
      // The claim may have been recorded with its reply lost: without a release the redelivery
      // would find the ticket busy until the lease ran out. Not awaited: when the ledger is down,
      // the release fails on its own time. A claim given up on after leaseMs needs none: any
      // lease it took has lapsed, and the redelivery takes it over (never two handlers: this
      // delivery runs none).
      void ledger.release(key, holder).catch(() => undefined);
      return this.requeue(CLAIM_LEDGER_UNAVAILABLE, errorMessage(error));
    }

    const release = () => this.releaseWithin(key, holder); // lapses anyway
    // Renewed from the claim on, not from the handler's start: a slow store (the head, the mark
    // below) would otherwise let the lease lapse first, and a copy of the ticket be handled too.
    const lease = claimLease(
      ledger,
      key,
      holder,
      this.options.tuning.leaseMs,
      claimedAt,
      this.logger,
    );
    const stopRenewing = () => lease.stop();
    // The lease may have lapsed, and a copy of the ticket be claimed elsewhere: this delivery
    // neither runs nor completes the handler, and is requeued as for a ledger outage.
    const leaseLost = async () => {
      await release(); // in case it is still this holder's
      const lost = errorMessage(abortReason(lease.signal));
      this.logger.warn(`${channel}: requeued ${key.ticket}: ${lost}`);
      return this.requeue(CLAIM_LEDGER_UNAVAILABLE, lost);
    };
    let metadata: Readonly<Record<string, string>> | undefined;
    let unpublished = false;
    try {
      const info = await this.parking.headWithin(store, ticket.ref);
      if (!info) throw new ClaimCheckNotFoundError(store.name, ticket.ref);
      metadata = info.metadata;
      unpublished = !info.published;
    } catch (error) {
      await stopRenewing();
      await release();
      const rejection = payloadReadRejection(error);
      if (rejection) return this.reject(channel, rejection, errorMessage(error));
      this.logger.warn(
        `${channel}: the ${store.name} payload store failed; requeued: ${errorMessage(error)}`,
      );
      return this.requeue(PAYLOAD_STORE_UNAVAILABLE, errorMessage(error));
    }

    // Found unpublished although its ticket is out: marked before its handler reads it, lest the
    // orphan sweeper take it meanwhile; a mark that failed is tried again should it be kept.
    if (unpublished) unpublished = !(await this.parking.markDelivered(store, ticket.ref, channel));
    this.metrics.checkedOut(store.name);
    const startedAt = this.parking.lifecycle.clock();
    const payload = ClaimedPayload.resolved(
      ticket,
      userHeadersOf(headers),
      metadata,
      (signal) => store.get(ticket.ref, { signal }),
      this.parking.readTimeoutMs,
    );
    // A payload this delivery leaves in the store, still unmarked (see PayloadParking.markDelivered).
    const keep = async () => {
      if (unpublished) await this.parking.markDelivered(store, ticket.ref, channel);
    };
    let outcome: HandlerOutcome;
    if (lease.signal.aborted) {
      await stopRenewing();
      payload.close();
      return leaseLost();
    }
    try {
      outcome = await this.runHandler(payload, consumer, `ticket ${key.ticket}`, lease.signal);
    } finally {
      payload.close();
      // Waits for a renewal on its way: landing after a release, it would take the lease again
      // for this holder, and the redelivery would find the ticket busy until it lapsed.
      await stopRenewing();
    }
    if (payload.integrityFailure) {
      await release();
      await keep(); // bytes it cannot decrypt yet are republished once the key is added
      return this.reject(channel, 'integrity-mismatch', payload.integrityFailure.message);
    }
    if (!outcome.ok) {
      await release();
      // Shutting down between two attempts: neither handled nor given up on; delivered again.
      if (outcome.stopped) return this.requeue('shutting down');
      if (lease.signal.aborted) return leaseLost();
      const readFailure = payload.readFailure;
      const rejection = payloadReadRejection(readFailure);
      if (rejection) {
        if (rejection === 'integrity-mismatch') await keep(); // as above
        return this.reject(channel, rejection, readFailure!.message);
      }
      if (readFailure && requeuedForItsRead(payload)) {
        this.logger.warn(
          `${channel}: the handler could not read ${key.ticket}; requeued: ${readFailure.message}`,
        );
        return this.requeue(PAYLOAD_STORE_UNAVAILABLE, readFailure.message);
      }
      await keep(); // for its dead letter to be republished
      const { code, detail } = handlerRejection(`ticket ${key.ticket}`, outcome);
      return this.reject(channel, code, detail);
    }
    this.parking.lifecycle.checkedOut(channel, ticket, startedAt);
    return this.completed(ticket, store, key, holder, consumer, keep);
  }

  /** A copy of a ticket its group completed: acked without calling the handler. */
  private async duplicate(
    ticket: ClaimTicket,
    store: PayloadStore,
    key: ClaimKey,
    holder: string,
    consumer: ClaimCheckConsumer,
  ): Promise<Disposition> {
    this.metrics.duplicate(consumer.channel);
    // The handling was recorded, but maybe not the delete after it (the reply to `complete`
    // lost, the process gone): deleting again is harmless, and the payload would otherwise
    // wait for its expiry.
    if (await this.consumedBy(ticket, key, holder, consumer)) {
      await this.deleteConsumed(store, ticket, consumer.channel);
    }
    return ACK;
  }

  /**
   * A ticket refused `expired`. A copy of one this channel handled (a redelivery whose ack was
   * lost, arriving past the expiry) is a duplicate, not a refusal: the ledger, which keeps the
   * completion `expiredGraceMs` past the expiry, is asked first. Only a ticket that would pass
   * every other check is: one replayed from another channel touches no ledger. A copy being
   * handled elsewhere (a live lease) is requeued, to be told apart once that ends.
   */
  private async expiredCopy(
    body: Buffer,
    consumer: ClaimCheckConsumer,
    expired: ClaimTicketInvalidError,
  ): Promise<Disposition> {
    const { channel } = consumer;
    const refuse = (note = '') =>
      this.reject(channel, 'claim-ticket-invalid', `${expired.message}${note}`);
    let ticket: ClaimTicket;
    let store: PayloadStore;
    try {
      ({ ticket, store } = this.parking.resolveExpiredOn(channel, body));
    } catch {
      return refuse();
    }
    const { ledger } = this.stores;
    const key: ClaimKey = { ticket: `${ticket.store}:${ticket.ref}`, group: channel };
    const holder = `${this.options.consumerId}:${randomUUID()}`;
    try {
      const claim = await this.claimWithin(key, holder);
      if (claim === 'done') return await this.duplicate(ticket, store, key, holder, consumer);
      if (claim === 'busy') return this.requeue(`ticket ${key.ticket} is being handled`);
    } catch (error) {
      void ledger.release(key, holder).catch(() => undefined);
      return refuse(
        ` (the ${ledger.name} claim ledger could not tell whether it was handled: ` +
          `${errorMessage(error)})`,
      );
    }
    // Not handled here: the claim only asked, and is given back for any other copy.
    await this.releaseWithin(key, holder);
    return refuse();
  }

  /** Records the group's completion, then applies the channel's retention. */
  private async completed(
    ticket: ClaimTicket,
    store: PayloadStore,
    key: ClaimKey,
    holder: string,
    consumer: ClaimCheckConsumer,
    keep: () => Promise<void>,
  ): Promise<Disposition> {
    let groups: number;
    try {
      // Tried again for half the lease (last renewed at most a third of it ago): a ledger back
      // within it records the completion, where giving up at once would leave the redelivery
      // busy until the lease lapsed, then handled a second time.
      groups = await retryWithin(
        () => this.completeGroup(ticket, key, holder),
        this.options.tuning.leaseMs / 2,
        {
          signal: this.host.stoppingOf(consumer.channel),
          onRetry: (error, waitMs) =>
            this.logger.warn(
              `${consumer.channel}: could not record ${key.ticket} as handled; trying again in ` +
                `${waitMs} ms: ${errorMessage(error)}`,
            ),
        },
      );
    } catch (error) {
      // The handler ran; unrecorded, the ticket may be handled again: at-least-once, never lost.
      this.logger.error(
        `${consumer.channel}: ${key.ticket} was handled but not recorded; requeued: ${errorMessage(error)}`,
      );
      return this.requeue(CLAIM_LEDGER_UNAVAILABLE, errorMessage(error));
    }
    // Before the ack: safe, since a redelivery now finds the group done in the ledger.
    if (deletesAfter(consumer, groups)) await this.deleteConsumed(store, ticket, consumer.channel);
    else await keep(); // for the other channels of its audience
    return ACK;
  }

  /**
   * For a duplicate of a ticket its group completed: whether the payload's consumers are all done
   * with it (its retention says delete now). With `{ consumers }`, the group count is asked
   * again (`complete` is idempotent): the reply to the completion that reached the count may
   * have been lost. Unknown (the ledger failing) counts as not done: the sweeper deletes the
   * payload at its expiry.
   */
  private async consumedBy(
    ticket: ClaimTicket,
    key: ClaimKey,
    holder: string,
    consumer: ClaimCheckConsumer,
  ): Promise<boolean> {
    const retention = consumer.deleteAfter;
    if (retention === 'ack') return true;
    if (typeof retention !== 'object') return false;
    try {
      return deletesAfter(consumer, await this.completeGroup(ticket, key, holder));
    } catch (error) {
      this.logger.warn(
        `${consumer.channel}: could not count the channels done with ${key.ticket}; its payload ` +
          `stays until the sweeper deletes it at its expiry: ${errorMessage(error)}`,
      );
      return false;
    }
  }

  /**
   * Records the group's completion of the ticket (idempotent: a repeat answers the same count);
   * resolves with how many groups have completed it.
   */
  private async completeGroup(ticket: ClaimTicket, key: ClaimKey, holder: string): Promise<number> {
    const now = Date.now();
    // Kept while a duplicate could still pass the ticket's expiry check, and expiredGraceMs
    // longer: a copy whose first delivery was handled just before the expiry (its ack lost) is
    // still told apart from an expired ticket (see expiredCopy).
    const retainUntil = Math.max(
      ticket.expiresAt + this.options.claimCheck.expiredGraceMs,
      now + 1,
    );
    // Each call bounded by the time its retries get (see completed): a ledger that never
    // answers must not hold the message. Given up on, it may still land: a redelivery then
    // finds the group done, and is acked as a duplicate.
    const { leaseMs } = this.options.tuning;
    const completion = await this.ledgerCallWithin(
      'complete',
      key,
      this.stores.ledger.complete(key, holder, retainUntil, now),
      Math.max(1, Math.floor(leaseMs / 2)),
      'half of tuning.leaseMs',
    );
    return completion.groups;
  }

  /**
   * Claims `key` for `holder`, given up on after `tuning.leaseMs` (`ClaimLedgerTimeoutError`):
   * by then any lease the call took has lapsed, so a claim that landed with its reply lost
   * cannot keep the redelivery busy, and this delivery runs no handler on it.
   */
  private claimWithin(key: ClaimKey, holder: string): Promise<ClaimOutcome> {
    const { leaseMs } = this.options.tuning;
    return this.ledgerCallWithin(
      'claim',
      key,
      this.stores.ledger.claim(key, holder, leaseMs, Date.now()),
      leaseMs,
      'tuning.leaseMs',
    );
  }

  /** Gives the lease up; never throws, and waits at most `tuning.leaseMs` (it lapses anyway). */
  private async releaseWithin(key: ClaimKey, holder: string): Promise<void> {
    const { leaseMs } = this.options.tuning;
    await this.ledgerCallWithin(
      'release',
      key,
      this.stores.ledger.release(key, holder),
      leaseMs,
      'tuning.leaseMs',
    ).catch((error: unknown) =>
      this.logger.warn(
        `could not release the claim on ${key.ticket}; it lapses after ${leaseMs} ms: ` +
          errorMessage(error),
      ),
    );
  }

  private ledgerCallWithin<T>(
    call: ClaimLedgerCall,
    key: ClaimKey,
    pending: Promise<T>,
    timeoutMs: number,
    option: string,
  ): Promise<T> {
    const { name } = this.stores.ledger;
    return withTimeout(
      pending,
      timeoutMs,
      () => new ClaimLedgerTimeoutError(name, call, key.ticket, key.group, timeoutMs, option),
    );
  }

  /** Deletes a payload its consumers are done with; a failure is left to the sweeper. */
  private async deleteConsumed(
    store: PayloadStore,
    ticket: ClaimTicket,
    channel: string,
  ): Promise<void> {
    await this.parking.storeCallWithin(store, ticket.ref, 'delete', store.delete(ticket.ref)).then(
      (deleted) => {
        if (deleted) this.metrics.payloadDeleted(store.name, 'consumed');
        if (deleted) this.parking.lifecycle.deleted(channel, store.name, ticket.ref, 'consumed');
      },
      (error: unknown) =>
        this.logger.warn(
          `${channel}: could not delete ${ticket.store}:${ticket.ref} after its consumers; the ` +
            `sweeper will at its expiry: ${errorMessage(error)}`,
        ),
    );
  }

  /** `until`: once it aborts, the running call is abandoned and no other made (see callHandler). */
  private async runHandler(
    payload: ClaimedPayload,
    consumer: ClaimCheckConsumer,
    subject: string,
    until?: AbortSignal,
  ): Promise<HandlerOutcome> {
    const { attempts } = consumer.handlerRetry;
    const { channel, handlerTimeoutMs } = consumer;
    const outcome = await callHandlerWithRetry(
      (context) => consumer.handler(payload, context),
      consumer.handlerRetry,
      {
        limit: {
          ms: handlerTimeoutMs,
          error: (attempt) => new HandlerTimeoutError(channel, subject, handlerTimeoutMs!, attempt),
          until,
        },
        onFailure: (error, attempt) => {
          // What the failed (or timed-out) call left half-read (a file handle, a store's socket)
          // is closed now: not held through the backoff and the next call, nor read on by the
          // abandoned call. A retry reads with a stream of its own.
          payload.closeStreams();
          this.metrics.handlerFailed(consumer.channel);
          this.logger.warn(
            `handler of ${consumer.channel} failed (attempt ${attempt} of ${attempts}): ${errorMessage(error)}`,
          );
        },
        // Wrong bytes, or a store that cannot be read: retrying the handler now cannot help.
        // (The claim lost ends the retries in callHandlerWithRetry, through limit.until.)
        isFinal: () => !!(payload.integrityFailure || payload.readFailure),
        // Requeued whatever the handler answered: a reply would be an answer the redelivery
        // contradicts.
        handsBack: () => requeuedForItsRead(payload),
        stop: this.host.stoppingOf(channel),
      },
    );
    if (!outcome.ok) return outcome;
    // A handler that swallowed its stream's error did not get the payload; nor did one that
    // swallowed a read error (store outage, payload gone).
    const swallowed = payload.integrityFailure ?? payload.readFailure;
    return swallowed ? { ok: false, attempts: outcome.attempts, error: swallowed } : outcome;
  }

  private reject(channel: string, code: RejectionCode, detail: string): Disposition {
    this.metrics.rejectedMessage(channel, code);
    const reason = deathReason(code, detail);
    this.logger.warn(`${channel}: dead-lettered a message: ${reason}`);
    return { action: 'dead-letter', reason };
  }

  /**
   * A store or ledger failure is requeued, but not forever (see storeRequeuesSpent): once the
   * message has been requeued `maxStoreRequeues` times, it is dead-lettered `store-unavailable`.
   * A fragment's parked body is bounded so by the reassembler already.
   */
  private boundedRequeue(
    disposition: Disposition,
    message: InboundMessage,
    channel: string,
  ): Disposition {
    const reason = disposition.action === 'requeue' ? disposition.reason : undefined;
    if (reason === undefined || !UNAVAILABLE.has(reason)) return disposition;
    const { cause, ...requeue } = disposition as StoreRequeue;
    const spent = storeRequeuesSpent(
      message.headers ?? {},
      reason,
      cause,
      this.options.tuning.maxStoreRequeues,
    );
    return spent === undefined ? requeue : this.reject(channel, 'store-unavailable', spent);
  }

  /** A delayed requeue; `cause` (the store's error) is told in the dead letter should it be one. */
  private requeue(reason: string, cause?: string): Disposition {
    const requeue: StoreRequeue = {
      action: 'requeue',
      delayMs: this.options.tuning.backpressureDelayMs,
      reason,
      ...(cause === undefined ? {} : { cause }),
    };
    return requeue;
  }
}

/** Whether a consumer's retention deletes the payload once `groups` channels completed it. */
function deletesAfter(consumer: ClaimCheckConsumer, groups: number): boolean {
  const retention = consumer.deleteAfter;
  return retention === 'ack' || (typeof retention === 'object' && groups >= retention.consumers);
}

/**
 * Whether a delivery of `payload` is requeued whatever its handler did: the store failed to give
 * its bytes back for a reason that may pass (an outage, not a verdict on the payload).
 */
function requeuedForItsRead(payload: ClaimedPayload): boolean {
  const { integrityFailure, readFailure } = payload;
  return (
    integrityFailure === undefined &&
    readFailure !== undefined &&
    payloadReadRejection(readFailure) === undefined
  );
}
