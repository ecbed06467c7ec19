import { Readable, Transform, pipeline, type TransformCallback } from 'node:stream';
import { Inject, Injectable, Logger } from '@nestjs/common';
import { sha256Hasher, sha256Hex } from '../core/checksum';
import { serializeTicket, signTicket, verifyTicket, type ClaimTicket } from '../core/claim-ticket';
import { ClaimCheckNotFoundError } from '../core/errors/claim-check-not-found.error';
import { ClaimCheckPublishError } from '../core/errors/claim-check-publish.error';
import { UnknownPayloadStoreError } from '../core/errors/unknown-payload-store.error';
import type { HeaderMap } from '../core/headers';
import { delay } from '../core/async';
import { ClaimCheckMetrics } from '../observability/claim-check.metrics';
import type { PayloadStore } from '../ports/payload-store.port';
import type { Transport } from '../ports/transport.port';
import { publishWithRetry } from '../sequence/publish-with-retry';
import { SEQUENCE_OPTIONS, SEQUENCE_TRANSPORT } from '../sequence.constants';
import type { ResolvedSequenceOptions } from '../sequence.options';
import { CLAIM_CHECK_OPTIONS } from './claim-check.constants';
import { ClaimCheckHeader } from './claim-check.headers';
import type { ResolvedClaimCheckOptions } from './claim-check.options';
import { ClaimedPayload } from './claimed-payload';

export interface CheckInOptions {
  contentType?: string;
  /** How long the payload and its ticket stay valid. @default claimCheck.ttlMs */
  ttlMs?: number;
  /** Small string pairs stored with the payload and handed to the receiver. */
  metadata?: Record<string, string>;
}

export interface ClaimPublishOptions extends CheckInOptions {
  /** Payloads up to this many bytes go inline. @default claimCheck.threshold */
  threshold?: number;
  /** Headers for the message (either way); they reach the handler as `payload.headers`. */
  headers?: HeaderMap;
}

/** What `publish()` sent. */
export interface ClaimPublishReceipt {
  readonly channel: string;
  readonly via: 'inline' | 'ticket';
  readonly bytes: number;
  /** The ticket that was published, for `via: 'ticket'`. */
  readonly ticket?: ClaimTicket;
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
  private readonly logger = new Logger(ClaimCheckService.name);

  constructor(
    @Inject(CLAIM_CHECK_OPTIONS) private readonly options: ResolvedClaimCheckOptions,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(SEQUENCE_OPTIONS) private readonly sequenceOptions: ResolvedSequenceOptions,
    private readonly metrics: ClaimCheckMetrics,
  ) {}

  /**
   * Streams `payload` into the payload store (a Readable is never buffered whole) and returns
   * its signed ticket. The caller owns the ticket: publish it, or `release` it.
   */
  checkIn(payload: Buffer | Readable, options: CheckInOptions = {}): Promise<ClaimTicket> {
    return this.park(payload, options, true);
  }

  /**
   * Verifies a ticket (signature, expiry, known store) and returns its payload, read lazily and
   * checked against the ticket's SHA-256 as it streams.
   * @throws ClaimTicketInvalidError, UnknownPayloadStoreError, ClaimCheckNotFoundError
   */
  async checkOut(ticket: unknown, headers: HeaderMap = {}): Promise<ClaimedPayload> {
    const verified = verifyTicket(ticket, this.options.keyring, Date.now());
    const store = this.storeNamed(verified.store);
    const info = await store.head(verified.ref);
    if (!info) throw new ClaimCheckNotFoundError(store.name, verified.ref);
    this.metrics.checkedOut(store.name);
    return ClaimedPayload.resolved(verified, headers, info.metadata, () => store.get(verified.ref));
  }

  /**
   * Deletes the payload a ticket names (expired tickets included); `false` when it was already
   * gone. The signature is still checked: only tickets signed here can delete.
   */
  async release(ticket: unknown): Promise<boolean> {
    // Expiry is no reason to keep a payload: check the ticket as of the epoch.
    const verified = verifyTicket(ticket, this.options.keyring, 0);
    return this.storeNamed(verified.store).delete(verified.ref);
  }

  /**
   * Publishes `payload` on `channel`: inline when it is at most `threshold` bytes, otherwise as
   * a ticket (`x-claim-check: 1`) to a payload stored first. If the ticket is not confirmed, the
   * stored payload is deleted again (or, failing that, left to the orphan sweeper) and
   * {@link ClaimCheckPublishError} is thrown.
   */
  async publish(
    channel: string,
    payload: Buffer | Readable,
    options: ClaimPublishOptions = {},
  ): Promise<ClaimPublishReceipt> {
    const threshold = options.threshold ?? this.options.threshold;
    const sized = await fitsInline(payload, threshold);
    if (sized.inline) {
      const headers: HeaderMap = {
        ...options.headers,
        [ClaimCheckHeader.claimCheck]: 0,
        ...(options.contentType ? { [ClaimCheckHeader.contentType]: options.contentType } : {}),
      };
      await this.send(channel, sized.inline, headers, 'inline');
      return { channel, via: 'inline', bytes: sized.inline.length };
    }

    const ticket = await this.park(sized.stream, options, false);
    const store = this.options.store;
    const headers: HeaderMap = { ...options.headers, [ClaimCheckHeader.claimCheck]: 1 };
    try {
      await this.send(channel, serializeTicket(ticket), headers, 'ticket', ticket);
    } catch (error) {
      await store
        .delete(ticket.ref)
        .catch((cause: unknown) =>
          this.logger.warn(
            `could not delete payload ${store.name}:${ticket.ref} after its ticket failed to ` +
              `publish; the orphan sweeper will: ${String(cause)}`,
          ),
        );
      throw error;
    }
    await this.markPublished(store, ticket.ref);
    return { channel, via: 'ticket', bytes: ticket.bytes, ticket };
  }

  /** The store a ticket names. @throws UnknownPayloadStoreError */
  storeNamed(name: string): PayloadStore {
    const store = this.options.stores.get(name);
    if (!store) throw new UnknownPayloadStoreError(name, [...this.options.stores.keys()]);
    return store;
  }

  private async park(
    payload: Buffer | Readable,
    options: CheckInOptions,
    published: boolean,
  ): Promise<ClaimTicket> {
    const store = this.options.store;
    const now = Date.now();
    const expiresAt = now + (options.ttlMs ?? this.options.ttlMs);
    const putOptions = {
      now,
      expiresAt,
      published,
      contentType: options.contentType,
      metadata: options.metadata,
    };
    let digest: { sha256: string; bytes: number };
    let ref: string;
    if (Buffer.isBuffer(payload)) {
      ({ ref } = await store.put(payload, putOptions));
      digest = { sha256: sha256Hex(payload), bytes: payload.length };
    } else {
      const meter = new DigestingStream();
      pipeline(payload, meter, () => undefined); // errors reach put through `meter`
      ({ ref } = await store.put(meter, putOptions));
      digest = meter.digest();
    }
    this.metrics.checkedIn(store.name, digest.bytes);
    return signTicket(
      { store: store.name, ref, ...digest, contentType: options.contentType, expiresAt },
      this.options.keyring,
    );
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
      this.sequenceOptions.publish,
    );
    if (!outcome.ok) {
      throw new ClaimCheckPublishError(
        channel,
        via,
        outcome.attempts,
        outcome.error,
        ticket && `${ticket.store}:${ticket.ref}`,
      );
    }
  }

  /** A few tries: an unmarked payload would be swept as an orphan after `orphanGraceMs`. */
  private async markPublished(store: PayloadStore, ref: string): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        await store.markPublished(ref);
        return;
      } catch (error) {
        if (attempt >= 3) {
          this.logger.error(
            `the ticket for ${store.name}:${ref} was published but the payload could not be ` +
              `marked published; it will be swept as an orphan after orphanGraceMs ` +
              `(${this.options.orphanGraceMs} ms) unless consumed first: ${String(error)}`,
          );
          return;
        }
        await delay(100 * attempt);
      }
    }
  }
}

/** Hashes and counts the bytes passing through. */
class DigestingStream extends Transform {
  private readonly hash = sha256Hasher();
  private bytes = 0;

  override _transform(chunk: Buffer, _encoding: BufferEncoding, done: TransformCallback): void {
    this.hash.update(chunk);
    this.bytes += chunk.length;
    done(null, chunk);
  }

  digest(): { sha256: string; bytes: number } {
    return { sha256: this.hash.digest('hex'), bytes: this.bytes };
  }
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
  const iterator = payload[Symbol.asyncIterator]() as AsyncIterator<Buffer | string>;
  const head: Buffer[] = [];
  let bytes = 0;
  for (;;) {
    const next = await iterator.next();
    if (next.done) return { inline: Buffer.concat(head, bytes) };
    const chunk = typeof next.value === 'string' ? Buffer.from(next.value) : next.value;
    head.push(chunk);
    bytes += chunk.length;
    if (bytes > threshold) break;
  }
  async function* rest(): AsyncGenerator<Buffer> {
    yield* head.splice(0);
    for (;;) {
      const next = await iterator.next();
      if (next.done) return;
      yield typeof next.value === 'string' ? Buffer.from(next.value) : next.value;
    }
  }
  return { stream: Readable.from(rest(), { objectMode: false }) };
}
