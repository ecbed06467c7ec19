import { Inject, Injectable, Logger } from '@nestjs/common';
import { crc32, sha256Hasher } from '../core/checksum';
import { MalformedFragmentError } from '../core/errors/malformed-fragment.error';
import { deathReason, type RejectionCode } from '../core/errors/rejection-code';
import { SequenceIntegrityError } from '../core/errors/sequence-integrity.error';
import { parseFragmentHeaders, type FragmentHeaders } from '../core/headers';
import { SequenceMetrics } from '../observability/sequence.metrics';
import type {
  AcceptResult,
  CompleteSequence,
  FinishContext,
  SequenceRef,
  SequenceStore,
} from '../ports/sequence-store.port';
import {
  defaultDeadLetterChannel,
  type Disposition,
  type InboundMessage,
} from '../ports/transport.port';
import { SEQUENCE_OPTIONS, SEQUENCE_STORE } from '../sequence.constants';
import {
  resolveConsumerOptions,
  sequenceLimits,
  type ResolvedConsumerOptions,
  type ResolvedSequenceOptions,
  type SequenceConsumerOptions,
} from '../sequence.options';
import { backoff, delay } from './publish-with-retry';
import { ReassembledPayload } from './reassembled-payload';

/** A function that receives reassembled sequences. */
export type SequenceHandlerFn = (payload: ReassembledPayload) => unknown;

/** A handler bound to a channel with its resolved options; made by `createConsumer`. */
export interface SequenceConsumer {
  readonly channel: string;
  readonly options: ResolvedConsumerOptions;
  readonly handler: SequenceHandlerFn;
}

const ACK: Disposition = { action: 'ack' };

/**
 * Consumer side of Message Sequence: validates each fragment, stores it, and when a sequence is
 * complete verifies it and hands it to the handler, once. `@SequencedHandler` methods are wired to
 * it by the module; use it directly when you consume with your own subscriber:
 *
 * @example
 * const consumer = aggregator.createConsumer('scans', (payload) => archive(payload.stream()));
 * myBroker.onMessage(async (msg) => settle(msg, await aggregator.receive(msg, consumer)));
 */
@Injectable()
export class AggregatorService {
  private readonly logger = new Logger(AggregatorService.name);
  /** Dead-letter channel of every consumer created here, for records published on its behalf. */
  private readonly deadLetterChannels = new Map<string, string>();

  constructor(
    @Inject(SEQUENCE_STORE) private readonly store: SequenceStore,
    @Inject(SEQUENCE_OPTIONS) private readonly options: ResolvedSequenceOptions,
    private readonly metrics: SequenceMetrics,
  ) {}

  /** Binds a handler to a channel, validating its option overrides. */
  createConsumer(
    channel: string,
    handler: SequenceHandlerFn,
    overrides: SequenceConsumerOptions = {},
  ): SequenceConsumer {
    const where = `sequence consumer of ${channel}`;
    const options = resolveConsumerOptions(where, overrides, this.options);
    if (options.deadLetterChannel) this.deadLetterChannels.set(channel, options.deadLetterChannel);
    return { channel, handler, options };
  }

  /** Where dead-letters of `channel` go: its consumer's `deadLetterChannel`, else `<channel>.dlq`. */
  deadLetterChannelOf(channel: string): string {
    return this.deadLetterChannels.get(channel) ?? defaultDeadLetterChannel(channel);
  }

  /**
   * Takes one fragment and says what to do with its message. Never throws: bad input becomes a
   * `dead-letter` with a reason, an unreachable store a delayed `requeue`. A fragment is acked only
   * once it is stored (or known to be a duplicate); the fragment that completes a sequence is acked
   * only after the handler succeeded.
   */
  async receive(message: InboundMessage, consumer: SequenceConsumer): Promise<Disposition> {
    const { channel, options } = consumer;
    this.metrics.fragmentReceived(channel, message.body.length);
    if (message.body.length > options.maxFragmentBytes) {
      return this.rejectFragment(
        channel,
        'fragment-too-large',
        `${message.body.length}-byte body exceeds maxFragmentBytes (${options.maxFragmentBytes})`,
      );
    }

    let fragment: FragmentHeaders;
    try {
      fragment = parseFragmentHeaders(message.headers);
    } catch (error) {
      if (error instanceof MalformedFragmentError) {
        return this.rejectFragment(channel, error.code, error.message);
      }
      throw error;
    }
    const { sequenceId, position } = fragment;
    const bodyCrc = crc32(message.body);
    if (bodyCrc !== fragment.crc32) {
      return this.rejectFragment(
        channel,
        'crc-mismatch',
        `sequence ${sequenceId} fragment ${position}: body CRC-32 is ${bodyCrc}, header says ${fragment.crc32}`,
      );
    }

    let result: AcceptResult;
    try {
      result = await this.store.accept(
        { ...fragment, scope: channel, body: message.body },
        {
          now: Date.now(),
          consumerId: this.options.consumerId,
          leaseMs: this.options.leaseMs,
          expiry: options.timeout,
          limits: sequenceLimits(options, this.options),
          retentionMs: this.options.retentionMs,
        },
      );
    } catch (error) {
      this.logger.warn(
        `${this.store.name} store could not take sequence ${sequenceId} fragment ${position} ` +
          `on ${channel}; requeued: ${describe(error)}`,
      );
      return this.requeue('store unavailable');
    }

    switch (result.status) {
      case 'stored':
        if (result.opened) this.metrics.sequenceStarted(channel);
        return ACK;
      case 'duplicate':
        this.metrics.duplicateFragment(channel);
        return ACK;
      case 'in-progress':
        return this.requeue(`sequence ${sequenceId} is being delivered by another consumer`);
      case 'backpressure':
        this.metrics.backpressured(channel, result.limit);
        return this.requeue(`${result.limit} reached`);
      case 'finished':
        if (result.outcome === 'completed' || result.outcome === 'failed') {
          this.metrics.duplicateFragment(channel);
          return ACK;
        }
        return this.rejectFragment(
          channel,
          result.outcome === 'rejected' ? 'sequence-rejected' : 'sequence-expired',
          `sequence ${sequenceId} fragment ${position} arrived after the sequence was ` +
            `${result.outcome}${result.reason ? ` (${result.reason})` : ''}`,
        );
      case 'rejected':
        if (result.sequenceRejected) this.metrics.sequenceRejected(channel, result.code);
        return this.rejectFragment(
          channel,
          result.code,
          `sequence ${sequenceId} fragment ${position}: ${result.detail}`,
        );
      case 'complete':
        if (result.opened) this.metrics.sequenceStarted(channel);
        return this.deliver(result.sequence, consumer);
    }
  }

  /**
   * Verifies a complete sequence and runs the handler, holding the completion lease (renewed in
   * the background) so that no other instance delivers it meanwhile.
   */
  private async deliver(
    sequence: CompleteSequence,
    consumer: SequenceConsumer,
  ): Promise<Disposition> {
    const ref: SequenceRef = { scope: sequence.scope, sequenceId: sequence.sequenceId };
    const stopRenewing = this.keepLease(ref);
    try {
      let digest: { sha256: string; bytes: number };
      try {
        digest = await this.digest(ref);
      } catch (error) {
        this.logger.warn(
          `could not read sequence ${ref.sequenceId} back from the store; requeued: ${describe(error)}`,
        );
        return this.handBack(ref);
      }
      const declared = { sha256: sequence.sha256, bytes: sequence.declaredBytes };
      if (
        digest.sha256 !== declared.sha256 ||
        (declared.bytes !== undefined && digest.bytes !== declared.bytes)
      ) {
        const error = new SequenceIntegrityError(ref.sequenceId, declared, digest);
        return this.failSequence(ref, consumer.channel, 'integrity-mismatch', error.message);
      }

      const payload = new ReassembledPayload({ ...sequence, sha256: digest.sha256 }, () =>
        this.store.read(ref),
      );
      const outcome = await this.runHandler(payload, consumer);
      if (!outcome.ok) {
        return this.failSequence(
          ref,
          consumer.channel,
          'handler-failed',
          `sequence ${ref.sequenceId}: handler failed ${outcome.attempts} time(s); last error: ${describe(outcome.error)}`,
        );
      }
      try {
        const finished = await this.store.finish(ref, 'completed', this.finishContext());
        if (!finished) {
          this.logger.warn(
            `sequence ${ref.sequenceId} was handled here after this instance lost its lease; ` +
              `another instance took it over (the handler may have run twice)`,
          );
          return ACK;
        }
      } catch (error) {
        // The handler ran; if the marker cannot be written the sequence may be delivered again
        // after the lease lapses: at-least-once, never lost.
        this.logger.error(
          `sequence ${ref.sequenceId} was handled but not marked completed: ${describe(error)}`,
        );
        return this.requeue('store unavailable');
      }
      this.metrics.sequenceCompleted(consumer.channel, sequence.firstFragmentAt);
      return ACK;
    } finally {
      stopRenewing();
    }
  }

  private async runHandler(
    payload: ReassembledPayload,
    consumer: SequenceConsumer,
  ): Promise<{ ok: true } | { ok: false; attempts: number; error: unknown }> {
    const { attempts, baseDelayMs } = consumer.options.handlerRetry;
    for (let attempt = 1; ; attempt++) {
      try {
        await consumer.handler(payload);
        return { ok: true };
      } catch (error) {
        this.metrics.handlerFailed(consumer.channel);
        this.logger.warn(
          `handler of ${consumer.channel} failed on sequence ${payload.sequenceId} ` +
            `(attempt ${attempt} of ${attempts}): ${describe(error)}`,
        );
        if (attempt >= attempts) return { ok: false, attempts: attempt, error };
        await delay(backoff(attempt, baseDelayMs, baseDelayMs * 2 ** attempts));
      }
    }
  }

  /** Marks the sequence failed (its fragments stay for inspection) and dead-letters the message. */
  private async failSequence(
    ref: SequenceRef,
    channel: string,
    code: RejectionCode,
    detail: string,
  ): Promise<Disposition> {
    try {
      const finished = await this.store.finish(ref, 'failed', {
        ...this.finishContext(),
        reason: deathReason(code, detail),
      });
      if (!finished) {
        // Another instance took the sequence over after this one's lease lapsed: its verdict
        // stands, and this failure is not the sequence's.
        this.logger.warn(
          `${channel}: not dead-lettering sequence ${ref.sequenceId} (${code}): another instance ` +
            `took it over after this one lost its lease`,
        );
        return ACK;
      }
    } catch (error) {
      this.logger.warn(
        `could not mark sequence ${ref.sequenceId} failed; requeued: ${describe(error)}`,
      );
      return this.requeue('store unavailable');
    }
    this.metrics.sequenceRejected(channel, code);
    this.logger.error(`${channel}: ${deathReason(code, detail)}`);
    return { action: 'dead-letter', reason: deathReason(code, detail) };
  }

  private async digest(ref: SequenceRef): Promise<{ sha256: string; bytes: number }> {
    const hash = sha256Hasher();
    let bytes = 0;
    for await (const chunk of this.store.read(ref)) {
      hash.update(chunk as Buffer);
      bytes += (chunk as Buffer).length;
    }
    return { sha256: hash.digest('hex'), bytes };
  }

  private keepLease(ref: SequenceRef): () => void {
    const { leaseMs, consumerId } = this.options;
    const timer = setInterval(
      () => {
        this.store.renewLease(ref, consumerId, leaseMs, Date.now()).then(
          (held) => {
            if (!held) this.logger.warn(`lost the completion lease of sequence ${ref.sequenceId}`);
          },
          (error: unknown) =>
            this.logger.warn(`could not renew the lease of ${ref.sequenceId}: ${describe(error)}`),
        );
      },
      Math.max(50, Math.floor(leaseMs / 3)),
    );
    timer.unref();
    return () => clearInterval(timer);
  }

  /** After a transient failure: let the lease go so the redelivered fragment can retry at once. */
  private async handBack(ref: SequenceRef): Promise<Disposition> {
    await this.store.releaseLease(ref, this.options.consumerId, Date.now()).catch(() => undefined); // the lease then lapses by itself
    return this.requeue('store unavailable');
  }

  private rejectFragment(channel: string, code: RejectionCode, detail: string): Disposition {
    this.metrics.fragmentRejected(channel, code);
    this.logger.warn(`${channel}: dead-lettered a fragment: ${deathReason(code, detail)}`);
    return { action: 'dead-letter', reason: deathReason(code, detail) };
  }

  private requeue(reason: string): Disposition {
    return { action: 'requeue', delayMs: this.options.backpressureDelayMs, reason };
  }

  private finishContext(): FinishContext {
    return {
      now: Date.now(),
      retentionMs: this.options.retentionMs,
      consumerId: this.options.consumerId,
    };
  }
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
