import type { Logger } from '@nestjs/common';
import { sha256Hasher } from '../core/checksum';
import { errorMessage } from '../core/errors/caught';
import { deathReason, type RejectionCode } from '../core/errors/rejection-code';
import { SequenceIntegrityError } from '../core/errors/sequence-integrity.error';
import { StoredFragmentIntegrityError } from '../core/errors/stored-fragment-integrity.error';
import type { SequenceMetrics } from './sequence.metrics';
import type {
  CompleteSequence,
  FinishContext,
  SequenceRef,
  SequenceStore,
} from '../ports/sequence-store.port';
import type { Disposition } from '../ports/transport.port';
import type { ResolvedOptions } from '../options/resolved-options';
import type { PayloadDigest } from './intake-digests';
import {
  callHandlerWithRetry,
  handlerRejection,
  type HandlerOutcome,
} from '../kernel/handler-retry';
import type { HandlerContext, HandlerTimeLimit } from '../kernel/handler-call';
import { HandlerTimeoutError } from '../core/errors/handler-timeout.error';
import { SequenceLeaseLostError } from '../core/errors/sequence-lease-lost.error';
import { retryWithin } from '../core/async';
import type { LeaseInstant } from '../core/lease-clock';
import { KeptLease, type LeaseTerms } from '../kernel/kept-lease';
import { ReassembledPayload } from './reassembled-payload';
import type { SequenceLifecycle } from './sequence.events';
import type { SequenceConsumer } from './sequence-consumer';

const ACK: Disposition = { action: 'ack' };

/** The completion lease a delivery works under: its sequence, its holder's token, its renewals. */
interface DeliveryLease {
  readonly ref: SequenceRef;
  readonly token: string;
  readonly kept: KeptLease;
}

/**
 * Delivers one complete sequence: verifies it, runs the handler (with retries) and records the
 * outcome, all under the completion lease identified by `leaseToken`. The token is unique to this
 * delivery, so even a second delivery of the same sequence in the same process (prefetch > 1,
 * after this one's lease lapsed) is a different holder: only the current holder may finish.
 */
export class SequenceDelivery {
  /** Set once the module stops: outcomes are no longer retried. */
  private stopped = false;

  constructor(
    private readonly store: SequenceStore,
    private readonly options: ResolvedOptions,
    private readonly metrics: SequenceMetrics,
    private readonly logger: Logger,
    private readonly lifecycle: SequenceLifecycle,
    /**
     * A channel's signal aborted at shutdown once deliveries in progress had their time
     * (ConsumerHost.stoppingOf).
     */
    private readonly stoppingOf: (channel: string) => AbortSignal | undefined,
  ) {}

  /**
   * `intakeDigest`, when this instance hashed every fragment in order as it stored them, spares
   * the read pass that otherwise verifies the payload before the handler: the handler's stream is
   * then verified as it flows instead (a store that returned other bytes than it took would make
   * that stream fail at its end, and the sequence is dead-lettered as an integrity mismatch).
   */
  async deliver(
    sequence: CompleteSequence,
    consumer: SequenceConsumer,
    leaseToken: string,
    /** When the accept that granted the completion lease was sent (the lease runs from then). */
    leaseGrantedAt: LeaseInstant,
    intakeDigest?: PayloadDigest,
  ): Promise<Disposition> {
    const ref: SequenceRef = { scope: sequence.scope, sequenceId: sequence.sequenceId };
    const declared = { sha256: sequence.sha256, bytes: sequence.declaredBytes };
    const lease: DeliveryLease = {
      ref,
      token: leaseToken,
      kept: this.keepLease(ref, leaseToken, leaseGrantedAt),
    };
    const lost = lease.kept.signal;
    try {
      if (sequence.integrityFailure !== undefined) {
        return await this.failIntegrity(lease, consumer.channel, sequence.integrityFailure);
      }
      const verifiedAtIntake = intakeDigest !== undefined && matches(intakeDigest, declared);
      let digest: PayloadDigest;
      if (verifiedAtIntake) {
        digest = intakeDigest;
      } else {
        try {
          digest = await this.digest(ref);
        } catch (error) {
          if (error instanceof StoredFragmentIntegrityError) {
            return await this.failIntegrity(lease, consumer.channel, error.message);
          }
          this.logger.warn(
            `could not read sequence ${ref.sequenceId} back from the store; requeued: ${errorMessage(error)}`,
          );
          return await this.handBack(lease);
        }
      }
      if (lost.aborted) return await this.leaseLost(lease);
      if (!matches(digest, declared)) {
        const error = new SequenceIntegrityError(ref.sequenceId, declared, digest);
        return await this.failIntegrity(lease, consumer.channel, error.message);
      }

      const payload = new ReassembledPayload(
        { ...sequence, sha256: digest.sha256 },
        () => this.store.read(ref),
        // A store that checks each body's CRC-32 as it reads spares the second SHA-256 pass; the
        // byte count is checked all the same. Read back: checked just before, nothing to add.
        verifiedAtIntake ? { digest, hash: this.store.verifiesReads !== true } : undefined,
      );
      const outcome = await runSequenceHandler(payload, consumer, this.metrics, this.logger, {
        stop: this.stoppingOf(consumer.channel),
        until: lost,
      });
      payload.close();
      if (payload.integrityFailure) {
        return await this.failIntegrity(
          lease,
          consumer.channel,
          `${payload.integrityFailure.message} (read back from the ${this.store.name} store)`,
        );
      }
      // Whatever the handler answered: one that caught its stream's error and returned did not
      // get the payload, and completing would delete the fragments it never read.
      if (payload.readFailure) {
        this.logger.warn(
          `the handler of ${consumer.channel} could not read sequence ${ref.sequenceId} from the ` +
            `store; requeued: ${payload.readFailure.message}`,
        );
        return await this.handBack(lease);
      }
      // Shutting down between two attempts: the handler neither succeeded nor gave up.
      if (!outcome.ok && outcome.stopped) return await this.handBack(lease);
      if (!outcome.ok && lost.aborted) return await this.leaseLost(lease);
      if (!outcome.ok) {
        const { code, detail } = handlerRejection(`sequence ${ref.sequenceId}`, outcome);
        const failure = { attempts: outcome.attempts };
        return await this.fail(lease, consumer.channel, code, detail, failure);
      }
      return await this.complete(lease, consumer.channel, sequence, outcome.attempts);
    } finally {
      // Once an outcome is recorded, a renewal landing late finds no lease to take.
      lease.kept.end();
    }
  }

  /**
   * The lease may have lapsed, and a redelivered fragment taken the sequence over: this delivery
   * records no outcome, and its fragment is requeued (after a release, in case the lease is
   * still this delivery's), to meet the other delivery's verdict.
   */
  private async leaseLost(lease: DeliveryLease): Promise<Disposition> {
    this.logger.warn(
      `requeued the completing fragment of sequence ${lease.ref.sequenceId} on ` +
        `${lease.ref.scope}: its completion lease was lost`,
    );
    return this.handBack(lease);
  }

  /** Ends the retries of outcomes in progress (after the shutdown's drain). */
  stop(): void {
    this.stopped = true;
  }

  private failIntegrity(
    lease: DeliveryLease,
    channel: string,
    message: string,
  ): Promise<Disposition> {
    return this.fail(lease, channel, 'integrity-mismatch', message);
  }

  private async complete(
    lease: DeliveryLease,
    channel: string,
    sequence: CompleteSequence,
    attempts: number,
  ): Promise<Disposition> {
    const { ref } = lease;
    const { firstFragmentAt } = sequence;
    try {
      const finished = await this.finishAfterHandler(lease, 'completed');
      if (!finished) {
        this.logger.warn(
          `sequence ${ref.sequenceId} was handled after this delivery lost its lease; another ` +
            `delivery took it over (the handler may have run twice)`,
        );
        return ACK;
      }
    } catch (error) {
      // The handler ran; the lease is kept (it lapses by itself), so the redelivered fragment
      // takes the sequence over only after `leaseMs`: at-least-once, never lost.
      this.logger.error(
        `sequence ${ref.sequenceId} was handled but not marked completed: ${errorMessage(error)}`,
      );
      return this.storeUnavailable();
    }
    this.metrics.sequenceCompleted(channel, firstFragmentAt);
    this.lifecycle.completed(channel, sequence, attempts);
    return ACK;
  }

  /** Marks the sequence failed (its fragments stay for inspection) and dead-letters the message. */
  private async fail(
    lease: DeliveryLease,
    channel: string,
    code: RejectionCode,
    detail: string,
    /** Set when the handler failed (else the sequence was rejected before or after it). */
    handler?: { attempts: number },
  ): Promise<Disposition> {
    const { ref } = lease;
    const reason = deathReason(code, detail);
    try {
      const finished = handler
        ? await this.finishAfterHandler(lease, 'failed', reason)
        : await this.store.finish(ref, 'failed', { ...this.finishContext(lease.token), reason });
      if (!finished) {
        // Another delivery took the sequence over after this one's lease lapsed: its verdict
        // stands, and this failure is not the sequence's.
        this.logger.warn(
          `${channel}: not dead-lettering sequence ${ref.sequenceId} (${code}): another delivery ` +
            `took it over after this one lost its lease`,
        );
        return ACK;
      }
    } catch (error) {
      this.logger.warn(
        `could not mark sequence ${ref.sequenceId} failed; requeued: ${errorMessage(error)}`,
      );
      // The handler ran: its lease is kept, as for a completion (see complete).
      return handler ? this.storeUnavailable() : this.handBack(lease);
    }
    this.metrics.sequenceRejected(channel, code);
    if (handler) this.lifecycle.failed(channel, ref.sequenceId, code, detail, handler.attempts);
    else this.lifecycle.rejected(channel, ref.sequenceId, code, detail);
    this.logger.error(`${channel}: ${reason}`);
    return { action: 'dead-letter', reason };
  }

  private async digest(ref: SequenceRef): Promise<PayloadDigest> {
    const hash = sha256Hasher();
    let bytes = 0;
    for await (const chunk of this.store.read(ref)) {
      hash.update(chunk as Buffer);
      bytes += (chunk as Buffer).length;
    }
    return { sha256: hash.digest('hex'), bytes };
  }

  /**
   * The completion lease, renewed while this delivery works under it. Once it may pass to another
   * delivery, its signal aborts with a {@link SequenceLeaseLostError}: the handler is asked to
   * stop, and no outcome is recorded.
   */
  private keepLease(ref: SequenceRef, leaseToken: string, grantedAt: LeaseInstant): KeptLease {
    const { leaseMs } = this.options.tuning;
    const { store } = this;
    const terms: LeaseTerms = {
      name: `the completion lease of sequence ${ref.sequenceId} on ${ref.scope}`,
      renew: () => store.renewLease(ref, leaseToken, leaseMs, Date.now()),
      lost: (why) =>
        new SequenceLeaseLostError(store.name, ref.scope, ref.sequenceId, why, leaseMs),
    };
    return new KeptLease(terms, leaseMs, grantedAt, this.logger);
  }

  /**
   * Records the outcome of a sequence whose handler ran. A store error is tried again, with the
   * lease renewed meanwhile, for up to half the lease (and not once the module stops): handing
   * the sequence back at the first error would let its redelivered fragment take it over at once
   * and run the handler again after a mere blip. Throws the last error once that time is up.
   *
   * `finish` refuses a sequence that already has a marker, this delivery's own included: after
   * an attempt that failed (its write may have gone through with the reply lost), a refusal is
   * this delivery's success when the marker holds this outcome.
   */
  private async finishAfterHandler(
    lease: DeliveryLease,
    outcome: 'completed' | 'failed',
    reason?: string,
  ): Promise<boolean> {
    const { ref } = lease;
    let failedBefore = false;
    const finished = await retryWithin(
      () => this.store.finish(ref, outcome, { ...this.finishContext(lease.token), reason }),
      this.options.tuning.leaseMs / 2,
      {
        stopped: () => this.stopped,
        signal: this.stoppingOf(ref.scope),
        onRetry: (error, waitMs) => {
          failedBefore = true;
          this.logger.warn(
            `could not mark sequence ${ref.sequenceId} ${outcome}; trying again in ${waitMs} ms: ` +
              errorMessage(error),
          );
        },
      },
    );
    return finished || (failedBefore && (await this.markedAs(ref, outcome)));
  }

  /** Whether the store's live marker of the sequence says `outcome` (false where it cannot tell). */
  private async markedAs(ref: SequenceRef, outcome: 'completed' | 'failed'): Promise<boolean> {
    const status = await this.store.status?.(ref, Date.now()).catch(() => undefined);
    return status?.state === 'finished' && status.outcome === outcome;
  }

  /**
   * After a transient failure: let the lease go so the redelivered fragment can retry at once.
   * Waits for a renewal on its way first: landing after the release, it would take the lease
   * again, and the redelivered fragment would find the sequence busy until it lapsed.
   */
  private async handBack(lease: DeliveryLease): Promise<Disposition> {
    await lease.kept.stop();
    // Should the release fail, the lease lapses by itself.
    await this.store.releaseLease(lease.ref, lease.token, Date.now()).catch(() => undefined);
    return this.storeUnavailable();
  }

  /** The fragment comes back later, behind what is queued. */
  private storeUnavailable(): Disposition {
    return {
      action: 'requeue',
      delayMs: this.options.tuning.backpressureDelayMs,
      reason: 'store unavailable',
    };
  }

  private finishContext(leaseToken: string): FinishContext {
    return {
      now: Date.now(),
      retentionMs: this.options.sequence.retentionMs,
      consumerId: leaseToken,
    };
  }
}

/** Whether a digest is what the producer declared (the SHA-256 is always declared, on the last fragment). */
export function matches(
  digest: PayloadDigest,
  declared: { sha256?: string; bytes?: number },
): boolean {
  return (
    digest.sha256 === declared.sha256 &&
    (declared.bytes === undefined || digest.bytes === declared.bytes)
  );
}

/**
 * Runs a sequence's handler under its retry policy and time limit, counting and logging each
 * failure. A payload whose bytes failed their check, or could not be read, ends the retries: the
 * handler cannot do better on another attempt. `stop`: see `callHandlerWithRetry`. `until`: once
 * it aborts, the running call is abandoned with its reason and no other made (see `callHandler`).
 */
export function runSequenceHandler(
  payload: ReassembledPayload,
  consumer: SequenceConsumer,
  metrics: SequenceMetrics,
  logger: Logger,
  {
    // The store path's rule: a read failure is requeued, a payload whose bytes failed is not.
    handsBack = () => !payload.integrityFailure && !!payload.readFailure,
    stop,
    until,
  }: { handsBack?: () => boolean; stop?: AbortSignal; until?: AbortSignal } = {},
): Promise<HandlerOutcome> {
  const { attempts } = consumer.options.handlerRetry;
  const { handlerTimeoutMs } = consumer.options;
  const limit: HandlerTimeLimit = {
    ms: handlerTimeoutMs,
    error: (attempt) =>
      new HandlerTimeoutError(
        consumer.channel,
        `sequence ${payload.sequenceId}`,
        handlerTimeoutMs!,
        attempt,
      ),
    until,
  };
  const call = (context: HandlerContext) => consumer.handler(payload, context);
  return callHandlerWithRetry(call, consumer.options.handlerRetry, {
    limit,
    onFailure: (error, attempt) => {
      metrics.handlerFailed(consumer.channel);
      logger.warn(
        `handler of ${consumer.channel} failed on sequence ${payload.sequenceId} ` +
          `(attempt ${attempt} of ${attempts}): ${errorMessage(error)}`,
      );
    },
    isFinal: () => !!(payload.integrityFailure || payload.readFailure),
    // Handed back whatever the handler answered (see deliver): a reply would be an answer the
    // redelivery contradicts.
    handsBack,
    stop,
  });
}
