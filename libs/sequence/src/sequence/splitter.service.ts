import { randomUUID } from 'node:crypto';
import { Readable } from 'node:stream';
import { Inject, Injectable } from '@nestjs/common';
import { crc32, sha256Hasher } from '../core/checksum';
import { CONTENT_TYPE_PATTERN } from '../core/claim-ticket';
import { userHeadersRefusal } from '../core/completeness';
import { SequencePublishError } from '../core/errors/sequence-publish.error';
import { SequenceSourceError } from '../core/errors/sequence-source.error';
import { abortReason } from '../core/async';
import { checkedBeforeReading, destroySource } from '../core/refused-source';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import {
  chunkBytes,
  fragmentCount,
  packRecords,
  planFragments,
  withLast,
} from '../core/fragment-planner';
import {
  buildFragmentHeaders,
  CLAIM_CHECK_HEADER,
  userHeaderProblems,
  SEQUENCE_ID_PATTERN,
  type FragmentHeaderInput,
  type HeaderMap,
} from '../core/headers';
import {
  asBufferPayload,
  isRecordSource,
  payloadProblem,
  type SequencePayload,
} from '../core/payload-source';
import {
  FRAGMENT_PARKING,
  type FragmentParking,
  type ParkedFragment,
  type SequenceSender,
} from '../kernel/pattern-contracts';
import { publishWithRetry } from '../kernel/publish-with-retry';
import { RESOLVED_OPTIONS, SEQUENCE_TRANSPORT } from '../kernel/tokens';
import type { ResolvedOptions, ResolvedPublishPolicy } from '../options/resolved-options';
import { resolvePublishPolicy } from '../options/resolve-shared';
import { checkKeys, SEND_KEYS, SEND_RENAMES } from '../options/option-keys';
import { headerBytes, type PartitionAddress, type Transport } from '../ports/transport.port';
import { partitionIndex, partitionsProblem } from '../core/partition';
import type { SendOptions, SequenceReceipt } from './splitter.types';
import { SequenceTracing } from './sequence.tracing';
import type { TraceSpan } from '../kernel/tracing/message-spans';

interface OutgoingFragment {
  readonly body: Buffer;
  readonly position: number;
  readonly headers: HeaderMap;
}

/**
 * Producer side of Message Sequence: cuts a payload into numbered, checksummed fragments that fit
 * the broker, publishes each with a confirm, and reports a receipt.
 *
 * @example
 * const receipt = await splitter.send('imaging.ai.intake', study, { headers: { study: 'CT-1' } });
 */
@Injectable()
export class SplitterService implements SequenceSender {
  private readonly traces: SequenceTracing;

  constructor(
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    @Inject(FRAGMENT_PARKING) private readonly parking: FragmentParking,
  ) {
    this.traces = new SequenceTracing(options.tracing);
  }

  /**
   * Sends `payload` as one sequence. Resolves once every fragment is confirmed; rejects with
   * {@link SequencePublishError} (naming the sequence and the fragment) when one could not be
   * confirmed within its retry budget, or {@link SequenceOptionsError} for invalid options.
   * Streams are read with back-pressure: at most about `publish.inFlight + 1` fragments are held.
   *
   * `signal` (@internal, for the module's own senders: a request nobody waits for any more) stops
   * the send once aborted: no further fragment is read or published (nor retried), a stream is
   * destroyed, and the send rejects with the signal's reason once the fragments in flight have
   * settled. The sequence stays incomplete (its last fragment is never sent) and expires.
   */
  async send(
    channel: string,
    payload: SequencePayload,
    options: SendOptions = {},
    signal?: AbortSignal,
  ): Promise<SequenceReceipt> {
    let sequenceId = '';
    let fragmentBytes = 0;
    const policy = checkedBeforeReading(payload, () => {
      if (typeof options !== 'object' || options === null || Array.isArray(options)) {
        throw new SequenceOptionsError(`send() to ${channel}`, [
          `options must be an object, got ${options === null ? 'null' : typeof options}`,
        ]);
      }
      // What was checked is what is sent: a caller changing its headers object while a stream
      // is sent would otherwise change the later fragments' headers, unchecked.
      options = withOwnHeaders(options);
      sequenceId = options.sequenceId ?? randomUUID();
      fragmentBytes = options.fragmentBytes ?? this.options.sequence.fragmentBytes;
      const checked = this.validate(channel, sequenceId, fragmentBytes, options, payload);
      if (signal?.aborted) throw abortReason(signal);
      return checked;
    });
    return this.traces.send(channel, sequenceId, async (span) => {
      const receipt = await this.sendTraced(channel, sequenceId, fragmentBytes, payload, options, {
        policy,
        span,
        signal,
      });
      span.set({
        'messaging.message.body.size': receipt.bytes,
        'messaging.batch.message_count': receipt.fragments,
      });
      return receipt;
    });
  }

  /**
   * Whether `send` (with the module's `fragmentBytes`, by broker) takes a payload of
   * `payloadBytes` with these headers, rather than refusing it with SequenceOptionsError: for a
   * caller that can send it another way.
   */
  fits(payloadBytes: number, options: Pick<SendOptions, 'headers' | 'contentType'>): boolean {
    const { fragmentBytes } = this.options.sequence;
    return this.sizeProblems(randomUUID(), fragmentBytes, options, payloadBytes).length === 0;
  }

  private async sendTraced(
    channel: string,
    sequenceId: string,
    fragmentBytes: number,
    payload: SequencePayload,
    options: SendOptions,
    {
      policy,
      span,
      signal,
    }: { policy: ResolvedPublishPolicy; span: TraceSpan; signal: AbortSignal | undefined },
  ): Promise<SequenceReceipt> {
    const sending = { ...options, signal };
    const base = {
      sequenceId,
      userHeaders: options.headers,
      contentType: options.contentType,
      contentEncoding: options.contentEncoding,
    };

    if (isByteArray(payload)) {
      const whole = asBufferPayload(payload);
      const plan = planFragments(whole.length, fragmentBytes);
      // Hashed fragment by fragment as they are published (the digest travels on the last one
      // only), so the first fragment leaves without waiting for a pass over the whole payload.
      const hash = sha256Hasher();
      let sha256 = '';
      const fragments = (function* (): Generator<OutgoingFragment> {
        for (const { position, offset, length } of plan) {
          const body = whole.subarray(offset, offset + length);
          const last = position === plan.length;
          hash.update(body);
          if (last) sha256 = hash.digest('hex');
          const headers = buildFragmentHeaders({
            ...base,
            position,
            size: plan.length,
            last,
            crc32: crc32(body),
            bytes: whole.length,
            sha256: last ? sha256 : undefined,
          });
          yield { body, position, headers };
        }
      })();
      await this.publishAll(channel, sequenceId, fragments, policy, sending, span);
      return { channel, sequenceId, fragments: plan.length, bytes: whole.length, sha256 };
    }

    const bodies = isRecordSource(payload)
      ? packRecords(payload.records, fragmentBytes)
      : chunkBytes(toAsyncIterable(payload), fragmentBytes);
    const hash = sha256Hasher();
    const totals = { fragments: 0, bytes: 0, sha256: '' };
    const fragments = (async function* (): AsyncGenerator<OutgoingFragment> {
      for await (const { value: body, last } of withLast(bodies)) {
        const position = ++totals.fragments;
        totals.bytes += body.length;
        hash.update(body);
        if (last) totals.sha256 = hash.digest('hex');
        const headers = buildFragmentHeaders({
          ...base,
          position,
          size: last ? position : undefined,
          last,
          crc32: crc32(body),
          bytes: last ? totals.bytes : undefined,
          sha256: last ? totals.sha256 : undefined,
        });
        yield { body, position, headers };
      }
    })();
    await this.publishAll(channel, sequenceId, fragments, policy, sending, span, () =>
      destroySource(payload),
    );
    return { channel, sequenceId, ...totals };
  }

  /**
   * Publishes fragments with up to `inFlight` awaiting their confirm. The source is pulled only
   * when a slot frees, which is what bounds memory for streams. On the first final failure no
   * further fragment is read; the ones in flight are allowed to settle, then the error is thrown.
   * A read of the source still waiting then (a live stream with nothing new) is not waited for:
   * `abandonSource` closes the source.
   */
  private async publishAll(
    channel: string,
    sequenceId: string,
    fragments: Iterable<OutgoingFragment> | AsyncIterable<OutgoingFragment>,
    policy: ResolvedPublishPolicy,
    options: Pick<SendOptions, 'via' | 'buffer' | 'partitions'> & { signal?: AbortSignal },
    span?: TraceSpan,
    abandonSource?: () => void,
  ): Promise<void> {
    const via = options.via ?? 'broker';
    const { signal } = options;
    const partition = this.partitionOf(sequenceId, options);
    const inFlight = new Set<Promise<void>>();
    let failure: Error | undefined;
    /** Ends the wait for the source's next fragment, if one is waited for. */
    let stopWaiting: (() => void) | undefined;
    const fail = (error: Error) => {
      failure ??= error;
      stopWaiting?.();
    };
    // Nobody wants the sequence any more: a stream is closed at once rather than read on (a
    // read under way settles as an error, after the abort's reason is the failure).
    const aborted = () => {
      fail(abortReason(signal!));
      abandonSource?.();
    };
    if (signal?.aborted) aborted();
    else signal?.addEventListener('abort', aborted, { once: true });
    // No retry, nor a first attempt, once aborted: a fragment's publish under way settles.
    const mayAttempt = () => signal?.aborted !== true;
    const publishOne = async ({ body, position, headers }: OutgoingFragment) => {
      let parked: ParkedFragment | undefined;
      if (via === 'claim-check') {
        try {
          parked = await this.parking.park(body, channel, { sequenceId, position });
        } catch (error) {
          fail(new SequencePublishError(channel, sequenceId, position, 0, error));
          return;
        }
      }
      const outcome = parked
        ? await publishWithRetry(
            this.transport,
            channel,
            parked.ticketBody,
            { ...headers, [CLAIM_CHECK_HEADER]: 1 },
            policy,
            mayAttempt,
            partition,
            signal,
          )
        : await publishWithRetry(
            this.transport,
            channel,
            body,
            headers,
            policy,
            mayAttempt,
            partition,
            signal,
          );
      if (outcome.ok && span)
        SequenceTracing.published(span, position, body.length, outcome.attempts);
      if (!outcome.ok) {
        fail(
          new SequencePublishError(channel, sequenceId, position, outcome.attempts, outcome.error),
        );
      }
      // A fragment whose confirm timed out may still arrive: keep its body (until expiry).
      if (parked) await this.parking.settle(parked, outcome.ok || outcome.maybeDelivered);
    };
    let sent = 0;
    let sourceFailure: unknown;
    const iterator =
      Symbol.asyncIterator in fragments
        ? fragments[Symbol.asyncIterator]()
        : fragments[Symbol.iterator]();
    let done = false;
    try {
      while (!failure) {
        const reading = Promise.resolve(iterator.next());
        // Not a Promise.race with one long-lived promise: each race would leave a reaction on it
        // holding its result, every fragment's body.
        const step = await new Promise<IteratorResult<OutgoingFragment> | typeof STOPPED>(
          (resolve, reject) => {
            stopWaiting = () => resolve(STOPPED);
            reading.then(resolve, reject);
          },
        );
        stopWaiting = undefined;
        if (step === STOPPED) {
          // Failed for good while the source had nothing to give: it may never give more.
          reading.catch(() => undefined);
          abandonSource?.();
          break;
        }
        if (step.done) {
          done = true;
          break;
        }
        // Failed for good after this fragment was read (and before this turn): send no more.
        if (failure) break;
        sent++;
        const pending = publishOne(step.value).finally(() => inFlight.delete(pending));
        inFlight.add(pending);
        if (inFlight.size >= policy.inFlight) await Promise.race(inFlight);
      }
    } catch (error) {
      // Only reading the source throws here (a publish's failure is recorded, not thrown).
      sourceFailure = error;
      done = true;
    } finally {
      // As a `for await` that breaks: the generators close what they read (not awaited when the
      // source was abandoned mid-read: its pending read settles first).
      if (!done) void Promise.resolve(iterator.return?.()).catch(() => undefined);
      await Promise.all(inFlight);
      signal?.removeEventListener('abort', aborted);
    }
    if (failure) throw failure;
    if (sourceFailure !== undefined) {
      throw new SequenceSourceError(channel, sequenceId, sent, sourceFailure);
    }
  }

  /** The partition a sequence's fragments go to when consumers hold them in the broker. */
  private partitionOf(
    sequenceId: string,
    options: Pick<SendOptions, 'buffer' | 'partitions'>,
  ): PartitionAddress | undefined {
    const { buffer, partitions } = this.bufferOf(options);
    if (buffer !== 'broker') return undefined;
    return { index: partitionIndex(sequenceId, partitions), count: partitions };
  }

  private bufferOf(options: Pick<SendOptions, 'buffer' | 'partitions'>): {
    buffer: 'store' | 'broker';
    partitions: number;
  } {
    const defaults = this.options.sequence.consumer;
    return {
      buffer: options.buffer ?? defaults.buffer,
      partitions: options.partitions ?? defaults.partitions,
    };
  }

  /** Checks a send's arguments; returns its publish policy (module policy plus overrides). */
  private validate(
    channel: string,
    sequenceId: string,
    fragmentBytes: number,
    options: SendOptions,
    payload: SequencePayload,
  ): ResolvedPublishPolicy {
    const problems: string[] = [];
    const refused = payloadProblem(payload, 'send');
    if (refused) problems.push(refused);
    checkKeys(problems, options, SEND_KEYS, SEND_RENAMES);
    const policy = resolvePublishPolicy(problems, 'publish', options.publish, this.options.publish);
    const { maxFragmentBytes } = this.options.sequence.consumer;
    const { headerAllowanceBytes } = this.options.tuning;
    if (typeof channel !== 'string' || channel.length === 0)
      problems.push('channel must be a non-empty string');
    if (!SEQUENCE_ID_PATTERN.test(sequenceId)) {
      problems.push(
        `sequenceId ${JSON.stringify(sequenceId)} must be 1-128 characters of [A-Za-z0-9._:-]`,
      );
    }
    if (!Number.isSafeInteger(fragmentBytes) || fragmentBytes < 1) {
      problems.push(`fragmentBytes must be a positive integer, got ${String(fragmentBytes)}`);
    } else if (fragmentBytes > maxFragmentBytes) {
      problems.push(
        `fragmentBytes (${fragmentBytes}) exceeds the module's sequence.maxFragmentBytes ` +
          `(${maxFragmentBytes}): its consumers would dead-letter every fragment ` +
          '(fragment-too-large)',
      );
    } else if (fragmentBytes + headerAllowanceBytes > this.transport.maxMessageBytes) {
      problems.push(
        `fragmentBytes (${fragmentBytes}) plus tuning.headerAllowanceBytes ` +
          `(${headerAllowanceBytes}) exceeds the ${this.transport.name} transport's ` +
          `maxMessageBytes (${this.transport.maxMessageBytes}); use at most ` +
          `${this.transport.maxMessageBytes - headerAllowanceBytes}`,
      );
    }
    const headerProblems = userHeaderProblems(options.headers ?? {});
    problems.push(...headerProblems);
    if (headerProblems.length === 0) {
      // Its consumers would dead-letter every fragment (headers-too-large).
      const refused = userHeadersRefusal(
        options.headers ?? {},
        this.options.sequence.consumer.maxHeaderBytes,
      );
      if (refused)
        problems.push(`headers: ${refused.detail}, the module's sequence.maxHeaderBytes`);
    }
    if (options.via !== undefined && options.via !== 'broker' && options.via !== 'claim-check') {
      problems.push(`via must be 'broker' or 'claim-check', got ${String(options.via)}`);
    }
    for (const name of ['contentType', 'contentEncoding'] as const) {
      const value: unknown = options[name];
      if (value !== undefined && (typeof value !== 'string' || !CONTENT_TYPE_PATTERN.test(value))) {
        problems.push(
          `${name} must be 1-255 printable ASCII characters, got ${JSON.stringify(value)}`,
        );
      }
    }
    const { buffer, partitions } = this.bufferOf(options);
    if (buffer !== 'store' && buffer !== 'broker') {
      problems.push(`buffer must be 'store' or 'broker', got ${String(buffer)}`);
    } else if (buffer === 'broker') {
      const refused = partitionsProblem(partitions);
      if (refused) problems.push(refused);
      if (!this.transport.partitioned) {
        problems.push(
          `buffer: 'broker' sends to partitions of the channel, and the ${this.transport.name} ` +
            'transport has no partitioned channels',
        );
      }
    }
    // Checked last, on arguments found valid.
    if (problems.length === 0) {
      const payloadBytes = isByteArray(payload) ? payload.byteLength : undefined;
      problems.push(...this.sizeProblems(sequenceId, fragmentBytes, options, payloadBytes));
    }
    if (problems.length > 0) throw new SequenceOptionsError(`send() to ${channel}`, problems);
    return policy;
  }

  /**
   * What a send of valid arguments could not deliver to consumers configured like this module:
   * a fragment message the transport refuses (a claim ticket replaces the body via claim check),
   * and, for a payload of known length (`payloadBytes`), a sequence its consumers would
   * dead-letter as a whole (`sequence-too-large`, `too-many-fragments`).
   */
  private sizeProblems(
    sequenceId: string,
    fragmentBytes: number,
    options: Pick<SendOptions, 'headers' | 'contentType' | 'contentEncoding' | 'via'>,
    payloadBytes: number | undefined,
  ): string[] {
    const problems: string[] = [];
    if ((options.via ?? 'broker') === 'broker') {
      const { maxMessageBytes, name } = this.transport;
      const largest = largestMessageBytes(
        {
          sequenceId,
          userHeaders: options.headers,
          contentType: options.contentType,
          contentEncoding: options.contentEncoding,
        },
        fragmentBytes,
        payloadBytes,
      );
      if (largest > maxMessageBytes) {
        problems.push(
          `headers: with the sequence's own, they make a ${largest}-byte fragment message, ` +
            `over the ${name} transport's maxMessageBytes (${maxMessageBytes}); ` +
            'send fewer header bytes or a smaller fragmentBytes',
        );
      }
    }
    if (payloadBytes === undefined) return problems;
    const { maxSequenceBytes, maxFragments } = this.options.sequence.consumer;
    const fragments = fragmentCount(payloadBytes, fragmentBytes);
    if (payloadBytes > maxSequenceBytes) {
      problems.push(
        `payload (${payloadBytes} bytes) exceeds the module's sequence.maxSequenceBytes ` +
          `(${maxSequenceBytes}): its consumers would dead-letter it (sequence-too-large)`,
      );
    } else if (fragments > maxFragments) {
      problems.push(
        `payload makes ${fragments} fragments of ${fragmentBytes} bytes, over the module's ` +
          `sequence.maxFragments (${maxFragments}): its consumers would dead-letter it ` +
          '(too-many-fragments); send a larger fragmentBytes',
      );
    }
    return problems;
  }
}

/** Byte chunks of a stream; a Readable with an encoding set yields strings, taken as UTF-8. */
async function* toAsyncIterable(
  payload: Readable | AsyncIterable<Uint8Array>,
): AsyncGenerator<Uint8Array> {
  for await (const chunk of payload as AsyncIterable<Uint8Array | string>) {
    yield typeof chunk === 'string' ? Buffer.from(chunk) : chunk;
  }
}

/**
 * Body plus headers of the largest fragment message a send publishes, trace headers aside (alike
 * on every fragment). The last fragment's headers are the widest (it alone carries the SHA-256
 * and the last flag), so a send could otherwise publish every fragment but the last. A payload of
 * unknown length (`payloadBytes` undefined) is taken to end on a full fragment, with the widest
 * position and byte count.
 */
function largestMessageBytes(
  base: Pick<FragmentHeaderInput, 'sequenceId' | 'userHeaders' | 'contentType' | 'contentEncoding'>,
  fragmentBytes: number,
  payloadBytes?: number,
): number {
  const size = payloadBytes === undefined ? undefined : fragmentCount(payloadBytes, fragmentBytes);
  const widest = {
    ...base,
    size: size ?? Number.MAX_SAFE_INTEGER,
    crc32: 0xffff_ffff,
    bytes: payloadBytes ?? Number.MAX_SAFE_INTEGER,
  };
  const last = headerBytes(
    buildFragmentHeaders({ ...widest, position: widest.size, last: true, sha256: '0'.repeat(64) }),
  );
  if (size === undefined || payloadBytes === undefined) return fragmentBytes + last;
  const lastBody = payloadBytes - (size - 1) * fragmentBytes;
  if (size === 1) return lastBody + last;
  const full = headerBytes(buildFragmentHeaders({ ...widest, position: size - 1, last: false }));
  return Math.max(fragmentBytes + full, lastBody + last);
}

/** `options` with a copy of its headers (when they are an object: anything else is refused). */
function withOwnHeaders(options: SendOptions): SendOptions {
  const { headers } = options;
  if (typeof headers !== 'object' || headers === null || Array.isArray(headers)) return options;
  return { ...options, headers: { ...headers } };
}

/** What `publishAll`'s wait for the source gives when a publish failed for good meanwhile. */
const STOPPED = Symbol('stopped');

/**
 * A whole payload in memory: a Buffer, any other typed array or a DataView (its bytes), from this
 * realm or another (a `vm` context, a worker's transferred array), as stream chunks are taken.
 */
function isByteArray(payload: unknown): payload is ArrayBufferView {
  return ArrayBuffer.isView(payload);
}
