import { Readable } from 'node:stream';
import { Inject, Injectable } from '@nestjs/common';
import {
  audienceChannel,
  CONTENT_TYPE_PATTERN,
  MAX_TICKET_BODY_BYTES,
  serializeTicket,
  reservedAudienceProblem,
  smallestTicketBytes,
  ticketAudienceProblem,
  type ClaimTicket,
} from '../core/claim-ticket';
import { ClaimCheckNotFoundError } from '../core/errors/claim-check-not-found.error';
import { ClaimCheckPublishError } from '../core/errors/claim-check-publish.error';
import { userHeaderProblems, type HeaderMap } from '../core/headers';
import { checkedBeforeReading, destroySource } from '../core/refused-source';
import { abortReason } from '../core/async';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { ClaimCheckMetrics } from './claim-check.metrics';
import { headerBytes, type Transport } from '../ports/transport.port';
import { publishWithRetry } from '../kernel/publish-with-retry';
import { ClaimCheckTracing } from './claim-check.tracing';
import {
  asBufferPayload,
  byteChunk,
  declaredBytes,
  isRecordSource,
  payloadProblem,
  type PayloadTaker,
  type RecordSource,
  type SequencePayload,
} from '../core/payload-source';
import { SEQUENCE_SENDER, type SequenceSender } from '../kernel/pattern-contracts';
import { isStringRecord } from '../core/objects';
import { sha256Hex } from '../core/checksum';
import {
  CLAIM_CHECK_STORES,
  RESOLVED_OPTIONS,
  SEQUENCE_TRANSPORT,
  type ClaimCheckStores,
} from '../kernel/tokens';
import type { ResolvedOptions } from '../options/resolved-options';
import { MAX_TTL_MS } from '../options/resolve-claim-check';
import {
  CHECK_IN_KEYS,
  checkKeys,
  CLAIM_PUBLISH_KEYS,
  CLAIM_PUBLISH_RENAMES,
  type KeyTree,
} from '../options/option-keys';
import { ClaimCheckHeader } from '../core/claim-check-headers';
import { ClaimedPayload } from './claimed-payload';
import { PayloadParking, type ParkOptions } from './payload-parking';

export interface CheckInOptions extends ParkOptions {
  /**
   * The channel, or channels, on which `@ClaimCheck` consumers may claim the ticket (signed into
   * it): publish the ticket there and nowhere else. Without one, only `checkOut` takes it.
   * @default none
   */
  audience?: string | readonly string[];
}

export interface ClaimPublishOptions extends ParkOptions {
  /** Payloads up to this many bytes go inline. @default claimCheck.inlineMaxBytes */
  inlineMaxBytes?: number;
  /**
   * `'claim-check'`: inline up to `inlineMaxBytes`, a ticket above. `'auto'`: inline up to
   * `inlineMaxBytes`, a Message Sequence up to `sequenceMaxBytes`, a ticket above; a stream goes as a
   * sequence only when `bytes` says its size (otherwise a ticket: its size is unknown). Either way,
   * with its headers counted: a payload goes inline only if it fits one message, as a sequence only
   * if `SplitterService.send` takes it, else the next way. The receiving `@ClaimCheck` handler takes
   * all three. @default 'claim-check'
   */
  mode?: 'claim-check' | 'auto';
  /** With `mode: 'auto'`: the largest payload sent as a sequence. @default claimCheck.sequenceMaxBytes */
  sequenceMaxBytes?: number;
  /** The size of a streamed payload, when known (lets `mode: 'auto'` choose a sequence). */
  bytes?: number;
  /** Headers for the message (either way); they reach the handler as `payload.headers`. */
  headers?: HeaderMap;
}

/** What `publish()` sent. */
export interface ClaimPublishReceipt {
  readonly channel: string;
  readonly via: 'inline' | 'ticket' | 'sequence';
  readonly bytes: number;
  /** SHA-256 of the payload, lowercase hex. */
  readonly sha256: string;
  /** Messages it took: a sequence's fragments, else 1. */
  readonly fragments: number;
  /** The ticket that was published, for `via: 'ticket'`. */
  readonly ticket?: ClaimTicket;
  /** The sequence's id, for `via: 'sequence'`. */
  readonly sequenceId?: string;
}

/**
 * Claim Check, sender side and by hand: park a payload in the payload store and get a signed
 * ticket (`checkIn`), resolve a ticket (`checkOut`), delete a payload (`release`), or let
 * `publish` choose between inline and a ticket by size.
 *
 * @example
 * const receipt = await claimCheck.publish('imaging.archive', createReadStream(path), {
 *   contentType: 'application/dicom',
 * });
 */
@Injectable()
export class ClaimCheckService {
  constructor(
    @Inject(RESOLVED_OPTIONS) private readonly resolved: ResolvedOptions,
    @Inject(CLAIM_CHECK_STORES) private readonly stores: ClaimCheckStores,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    private readonly metrics: ClaimCheckMetrics,
    private readonly parking: PayloadParking,
    @Inject(SEQUENCE_SENDER) private readonly sequences: SequenceSender,
  ) {
    this.traces = new ClaimCheckTracing(resolved.tracing);
  }

  private readonly traces: ClaimCheckTracing;

  private get options(): ResolvedOptions['claimCheck'] {
    return this.resolved.claimCheck;
  }

  /**
   * Streams `payload` into the payload store (a Readable is never buffered whole) and returns
   * its ticket, signed for the channels of `options.audience`. The caller owns the ticket:
   * publish it to those channels, or `release` it.
   *
   * @example
   * // fan-out: one stored payload, one ticket, two consumer groups
   * const ticket = await claimCheck.checkIn(study, {
   *   audience: ['imaging.billing', 'imaging.archive'],
   * });
   */
  async checkIn(payload: Buffer | Readable, options: CheckInOptions = {}): Promise<ClaimTicket> {
    let audience: readonly string[] = [];
    checkedBeforeReading(payload, () => {
      refusePayload('checkIn()', payload, 'checkIn');
      checkCallOptions('checkIn()', options, CHECK_IN_KEYS);
      audience = audienceOption(options.audience);
    });
    const { audience: _audience, ...parkOptions } = options;
    const bytes = asBufferPayload(payload);
    return this.traces.checkIn(() => this.parking.park(bytes, parkOptions, true, audience));
  }

  /**
   * Verifies a ticket (signature, expiry, known store) and returns its payload, read lazily and
   * checked against the ticket's SHA-256 as it streams. It consumes no channel, so it does not
   * check the ticket's audience: compare `payload.ticket.audience` with your own channel when
   * tickets reach you from a broker. A payload found unpublished is marked published: its ticket
   * is out, so it is no orphan. A store that does not answer within `claimCheck.readTimeoutMs`
   * (here, or on a read of the stream) fails with PayloadReadTimeoutError.
   * @throws ClaimTicketInvalidError, UnknownPayloadStoreError, ClaimCheckNotFoundError,
   * PayloadReadTimeoutError
   */
  async checkOut(ticket: unknown, headers: HeaderMap = {}): Promise<ClaimedPayload> {
    const startedAt = this.parking.lifecycle.clock();
    const { ticket: verified, store } = this.parking.resolve(ticket);
    return this.traces.checkOut(undefined, verified, headers, async () => {
      const info = await this.parking.headWithin(store, verified.ref);
      if (!info) throw new ClaimCheckNotFoundError(store.name, verified.ref);
      // Found unpublished although its ticket reached the caller (its sender died before the
      // mark): no orphan, and kept by this checkout, so marked lest the sweeper take it.
      if (!info.published) await this.parking.markDelivered(store, verified.ref, 'checkOut()');
      this.metrics.checkedOut(store.name);
      this.parking.lifecycle.checkedOut(
        audienceChannel(verified.audience?.[0] ?? ''),
        verified,
        startedAt,
      );
      return ClaimedPayload.resolved(
        verified,
        headers,
        info.metadata,
        (signal) => store.get(verified.ref, { signal }),
        this.parking.readTimeoutMs,
      );
    });
  }

  /**
   * Deletes the payload a ticket names (expired tickets included); `false` when it was already
   * gone. The signature is still checked: only tickets signed here can delete. A store that does
   * not answer within `claimCheck.readTimeoutMs` fails it with PayloadStoreTimeoutError (the
   * delete may still land; otherwise the sweeper deletes the payload at its expiry).
   * @throws ClaimTicketInvalidError, UnknownPayloadStoreError, PayloadStoreTimeoutError, or the
   * store's error
   */
  async release(ticket: unknown): Promise<boolean> {
    // Expiry is no reason to keep a payload: check the ticket as of the epoch.
    const { ticket: verified, store } = this.parking.resolve(ticket, 0);
    const deleted = await this.parking.storeCallWithin(
      store,
      verified.ref,
      'delete',
      store.delete(verified.ref),
    );
    const channel = audienceChannel(verified.audience?.[0] ?? '');
    if (deleted) this.parking.lifecycle.deleted(channel, store.name, verified.ref, 'released');
    return deleted;
  }

  /**
   * Publishes `payload` on `channel`: inline when it is at most `inlineMaxBytes` bytes and fits one
   * message with its headers, otherwise as
   * a ticket (`x-claim-check: 1`, issued for `channel` alone) to a payload stored first. If the
   * ticket is not confirmed, the stored payload is deleted again (or, failing that, left to the
   * orphan sweeper; kept when the confirm timed out, since the ticket may still arrive) and
   * {@link ClaimCheckPublishError} is thrown.
   *
   * `signal` (@internal, for the module's own senders: a request nobody waits for any more) stops
   * the publish once aborted: a stream given is destroyed at once, a payload being stored is not
   * kept (deleted again if it was stored whole), a sequence sends no further fragment (see
   * `SplitterService.send`), no ticket is published, and it rejects with the signal's reason.
   */
  publish(
    channel: string,
    payload: Buffer | Readable | RecordSource,
    options: ClaimPublishOptions = {},
    signal?: AbortSignal,
  ): Promise<ClaimPublishReceipt> {
    return this.traces.send(channel, async (span) => {
      const receipt = await this.publishTraced(channel, payload, options, signal);
      span.set({
        'nest_sequence.claim_check.via': receipt.via,
        'messaging.message.body.size': receipt.bytes,
      });
      return receipt;
    });
  }

  /** {@link publishUntraced}, stopped once `signal` aborts. */
  private async publishTraced(
    channel: string,
    payload: Buffer | Readable | RecordSource,
    options: ClaimPublishOptions,
    signal: AbortSignal | undefined,
  ): Promise<ClaimPublishReceipt> {
    if (signal === undefined) return this.publishUntraced(channel, payload, options, undefined);
    // The caller's stream (a file, a socket) is closed at once, not read on for nobody: what
    // reads it (the store's upload, the splitter) fails, and the abort's reason is the outcome.
    const stop = () => destroySource(payload);
    if (!signal.aborted) signal.addEventListener('abort', stop, { once: true });
    try {
      return await this.publishUntraced(channel, payload, options, signal);
    } catch (error) {
      throw signal.aborted && !(error instanceof SequenceOptionsError)
        ? abortReason(signal)
        : error;
    } finally {
      signal.removeEventListener('abort', stop);
    }
  }

  private async publishUntraced(
    channel: string,
    payload: Buffer | Readable | RecordSource,
    options: ClaimPublishOptions,
    signal: AbortSignal | undefined,
  ): Promise<ClaimPublishReceipt> {
    const threshold = options.inlineMaxBytes ?? this.options.inlineMaxBytes;
    /** Throws the abort's reason once nobody wants the payload any more. */
    const unlessAborted = () => {
      if (signal?.aborted) throw abortReason(signal);
    };
    checkedBeforeReading(payload, () => {
      refusePayload(`publish() to ${channel}`, payload, 'publish');
      const reserved = reservedAudienceProblem(channel);
      if (reserved !== undefined) {
        throw new SequenceOptionsError(`publish() to ${channel}`, [reserved]);
      }
      checkCallOptions(`publish() to ${channel}`, options, CLAIM_PUBLISH_KEYS);
      if (threshold > this.options.maxInlineBytes) {
        // It would read a stream up to it into memory, then fail to send it inline anyway.
        throw new SequenceOptionsError(`publish() to ${channel}`, [
          `inlineMaxBytes (${threshold}) exceeds what one message of the transport carries ` +
            `(${this.options.maxInlineBytes} bytes besides headers); use at most ` +
            `${this.options.maxInlineBytes}`,
        ]);
      }
      unlessAborted();
    });
    payload = asBufferPayload(payload);
    const sequenceMaxBytes = options.sequenceMaxBytes ?? this.options.sequenceMaxBytes;
    const inlineHeaders: HeaderMap = {
      ...options.headers,
      [ClaimCheckHeader.claimCheck]: 0,
      ...(options.contentType ? { [ClaimCheckHeader.contentType]: options.contentType } : {}),
    };
    // Inline only within one message with its headers, a sequence only when send() takes it:
    // a payload either would refuse goes the next way, rather than fail once published.
    const inlineMaxBytes = Math.min(
      threshold,
      this.transport.maxMessageBytes - headerBytes(inlineHeaders),
    );
    const asSequence = (bytes: number | undefined): bytes is number =>
      options.mode === 'auto' &&
      bytes !== undefined &&
      bytes <= sequenceMaxBytes &&
      this.sequences.fits(bytes, options);
    if (isRecordSource(payload)) {
      const { bytes } = options;
      if (bytes !== undefined && bytes > inlineMaxBytes && asSequence(bytes)) {
        // Record-aware: no record is cut across two fragments. Held to `bytes`, which chose the
        // route: records that pass it fail the send rather than make a sequence too large.
        return this.sendSequence(
          channel,
          { records: declaredBytes(payload.records, bytes) },
          options,
          signal,
        );
      }
      payload = Readable.from(payload.records, { objectMode: false });
    }
    const sized = await fitsInline(payload, inlineMaxBytes);
    if (sized.inline) {
      unlessAborted();
      await this.send(channel, sized.inline, inlineHeaders, 'inline');
      return {
        channel,
        via: 'inline',
        bytes: sized.inline.length,
        sha256: sha256Hex(sized.inline),
        fragments: 1,
      };
    }

    const knownBytes = Buffer.isBuffer(sized.stream) ? sized.stream.length : options.bytes;
    if (asSequence(knownBytes)) {
      const body = Buffer.isBuffer(sized.stream)
        ? sized.stream
        : declaredBytes(sized.stream, knownBytes);
      return this.sendSequence(channel, body, options, signal);
    }

    // The upload stops with the stream it reads (the caller's is destroyed with it; records are
    // read through one of this call's own).
    const stopUpload = () => destroySource(sized.stream);
    signal?.addEventListener('abort', stopUpload, { once: true });
    let ticket: ClaimTicket;
    try {
      ticket = await this.traces.checkIn(() =>
        this.parking.park(sized.stream, options, false, [channel]),
      );
    } finally {
      signal?.removeEventListener('abort', stopUpload);
    }
    if (signal?.aborted) {
      // Stored whole before the abort came (a Buffer is not cut short): nobody will claim it.
      await this.parking.settle(ticket, false);
      throw abortReason(signal);
    }
    const headers: HeaderMap = { ...options.headers, [ClaimCheckHeader.claimCheck]: 1 };
    try {
      await this.send(channel, serializeTicket(ticket), headers, 'ticket', ticket);
    } catch (error) {
      // A ticket that may have reached the queue (its confirm timed out) must find its payload:
      // kept as published, until a consumer deletes it or it expires.
      const maybeDelivered = error instanceof ClaimCheckPublishError && error.maybeDelivered;
      await this.parking.settle(ticket, maybeDelivered);
      throw error;
    }
    await this.parking.settle(ticket, true);
    return {
      channel,
      via: 'ticket',
      bytes: ticket.bytes,
      sha256: ticket.sha256,
      fragments: 1,
      ticket,
    };
  }

  private async sendSequence(
    channel: string,
    payload: SequencePayload,
    options: ClaimPublishOptions,
    signal: AbortSignal | undefined,
  ): Promise<ClaimPublishReceipt> {
    const receipt = await this.sequences.send(
      channel,
      payload,
      {
        headers: options.headers,
        contentType: options.contentType,
        // Store-buffered whatever the module's `sequence.buffer`: a @ClaimCheck channel (a
        // microservice's pattern, a reply channel) reassembles from the channel itself and reads
        // no partition.
        buffer: 'store',
      },
      signal,
    );
    return {
      channel,
      via: 'sequence',
      bytes: receipt.bytes,
      sha256: receipt.sha256,
      fragments: receipt.fragments,
      sequenceId: receipt.sequenceId,
    };
  }

  private async send(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    via: 'inline' | 'ticket',
    ticket?: ClaimTicket,
  ): Promise<void> {
    const outcome = await publishWithRetry(
      this.transport,
      channel,
      body,
      headers,
      this.resolved.publish,
    );
    if (!outcome.ok) {
      throw new ClaimCheckPublishError(
        channel,
        via,
        outcome.attempts,
        outcome.error,
        ticket && `${ticket.store}:${ticket.ref}`,
        outcome.maybeDelivered,
      );
    }
  }
}

/**
 * `checkIn`'s audience as the list a ticket carries.
 * @throws SequenceOptionsError when it is not a name or a list of distinct names of 1-255 characters
 */
function audienceOption(given: CheckInOptions['audience']): readonly string[] {
  if (given === undefined) return [];
  const audience = typeof given === 'string' ? [given] : given;
  const problem =
    ticketAudienceProblem(audience) ??
    audience.map((channel) => reservedAudienceProblem(channel, 'audience channel')).find(Boolean);
  if (problem !== undefined) throw new SequenceOptionsError('checkIn()', [problem]);
  // Refused before the payload is stored, rather than once signing its ticket fails.
  const smallest = smallestTicketBytes(audience);
  if (smallest > MAX_TICKET_BODY_BYTES) {
    throw new SequenceOptionsError('checkIn()', [
      `audience makes a ticket of at least ${smallest} bytes, over the ` +
        `${MAX_TICKET_BODY_BYTES}-byte limit for tickets; name fewer or shorter channels`,
    ]);
  }
  return audience;
}

/** Refuses per-call options the module would have refused at boot, and reserved headers. */
function checkCallOptions(where: string, options: ClaimPublishOptions, keys: KeyTree): void {
  const problems: string[] = [];
  checkKeys(problems, options, keys, CLAIM_PUBLISH_RENAMES);
  const integer = (name: string, value: number | undefined, min: number) => {
    if (value !== undefined && (!Number.isSafeInteger(value) || value < min)) {
      problems.push(`${name} must be an integer ≥ ${min}, got ${String(value)}`);
    }
  };
  const { mode } = options as { readonly mode?: unknown };
  if (mode !== undefined && mode !== 'claim-check' && mode !== 'auto') {
    problems.push(`mode must be 'claim-check' or 'auto', got ${JSON.stringify(mode)}`);
  }
  integer('ttlMs', options.ttlMs, 1);
  if (options.ttlMs !== undefined && options.ttlMs > MAX_TTL_MS) {
    problems.push(`ttlMs must be at most ${MAX_TTL_MS} (100 years), got ${options.ttlMs}`);
  }
  integer('inlineMaxBytes', options.inlineMaxBytes, 0);
  integer('sequenceMaxBytes', options.sequenceMaxBytes, 0);
  integer('bytes', options.bytes, 0);
  if (options.contentType !== undefined && !CONTENT_TYPE_PATTERN.test(options.contentType)) {
    problems.push('contentType must be 1-255 printable ASCII characters (a media type)');
  }
  if (options.metadata !== undefined && !isStringRecord(options.metadata)) {
    problems.push('metadata must be an object of strings');
  }
  problems.push(...userHeaderProblems(options.headers ?? {}));
  if (problems.length > 0) throw new SequenceOptionsError(where, problems);
}

/**
 * Whether a payload fits in `threshold` bytes: a Buffer is measured; a stream is read until it
 * ends (inline) or passes the threshold (then the bytes read so far are put back in front).
 */
async function fitsInline(
  payload: Buffer | Readable,
  threshold: number,
): Promise<
  { inline: Buffer; stream?: undefined } | { inline?: undefined; stream: Buffer | Readable }
> {
  if (Buffer.isBuffer(payload)) {
    return payload.length <= threshold ? { inline: payload } : { stream: payload };
  }
  const iterator = payload[Symbol.asyncIterator]() as AsyncIterator<unknown>;
  const head: Buffer[] = [];
  let bytes = 0;
  for (;;) {
    const next = await iterator.next();
    if (next.done) return { inline: Buffer.concat(head, bytes) };
    let chunk: Buffer;
    try {
      chunk = byteChunk(next.value);
    } catch (error) {
      payload.destroy();
      throw error;
    }
    head.push(chunk);
    bytes += chunk.length;
    if (bytes > threshold) break;
  }
  async function* rest(): AsyncGenerator<Buffer> {
    yield* head.splice(0);
    for (;;) {
      const next = await iterator.next();
      if (next.done) return;
      yield byteChunk(next.value);
    }
  }
  const stream = Readable.from(rest(), { objectMode: false });
  // Whoever stops reading the wrapper (a store that refused the payload, a failed send) destroys
  // it; the caller's stream (a file, say) must close with it, or its handle stays open.
  stream.once('close', () => {
    if (!payload.readableEnded) payload.destroy();
  });
  return { stream };
}

/** A payload of a type `taker` does not take, refused before anything is read or stored. */
function refusePayload(call: string, payload: unknown, taker: PayloadTaker): void {
  const refused = payloadProblem(payload, taker);
  if (refused) throw new SequenceOptionsError(call, [refused]);
}
