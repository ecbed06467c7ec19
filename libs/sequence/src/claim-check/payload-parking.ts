import type { Readable } from 'node:stream';
import { Inject, Injectable, Logger, type OnApplicationShutdown } from '@nestjs/common';
import { delay, withTimeout } from '../core/async';
import { sourceChunks, type StallBound } from '../core/source-chunks';
import {
  audienceChannel,
  checkTicketAudience,
  parseTicketBody,
  signTicket,
  verifyTicket,
  verifyTicketSignature,
  type ClaimTicket,
  type TicketFragment,
} from '../core/claim-ticket';
import { ClaimCheckIntegrityError } from '../core/errors/claim-check-integrity.error';
import { ClaimCheckNotFoundError } from '../core/errors/claim-check-not-found.error';
import { ClaimTicketInvalidError } from '../core/errors/claim-ticket-invalid.error';
import { PayloadReadTimeoutError } from '../core/errors/payload-read-timeout.error';
import {
  PayloadStoreTimeoutError,
  type PayloadStoreCall,
} from '../core/errors/payload-store-timeout.error';
import { UnknownPayloadStoreError } from '../core/errors/unknown-payload-store.error';
import { ClaimCheckMetrics } from './claim-check.metrics';
import { uploadPayload } from './payload-upload';
import { sha256Hex } from '../core/checksum';
import type { PayloadInfo, PayloadStore } from '../ports/payload-store.port';
import {
  CLAIM_CHECK_STORES,
  RESOLVED_OPTIONS,
  SEQUENCE_TRANSPORT,
  type ClaimCheckStores,
} from '../kernel/tokens';
import type { Transport } from '../ports/transport.port';
import type { ResolvedClaimCheckOptions, ResolvedOptions } from '../options/resolved-options';
import { errorMessage } from '../core/errors/caught';
import { SequenceEvents } from '../kernel/lifecycle-events';
import { ClaimCheckLifecycle } from './claim-check.events';

/** How a payload is parked. */
export interface ParkOptions {
  contentType?: string;
  /** How long the payload and its ticket stay valid. @default claimCheck.ttlMs */
  ttlMs?: number;
  /** Small string pairs stored with the payload and handed to the receiver. */
  metadata?: Record<string, string>;
}

/** A verified ticket and the store holding its payload. */
export interface ResolvedTicket {
  readonly ticket: ClaimTicket;
  readonly store: PayloadStore;
}

/**
 * The two halves of Claim Check that everything else is built on: parking a payload (streamed
 * into the payload store, hashed on the way, then a ticket signed for the channels it is sent
 * to) and resolving a ticket (signature, expiry, audience, known store). `ClaimCheckService`,
 * the receiver and the splitter's `via: 'claim-check'` mode share them.
 */
@Injectable()
export class PayloadParking implements OnApplicationShutdown {
  private readonly logger = new Logger('ClaimCheck');
  private readonly options: ResolvedClaimCheckOptions;
  private stopped = false;
  private keysWarned = false;
  /** Claim Check's lifecycle events, for the receiver and the service too. */
  readonly lifecycle: ClaimCheckLifecycle;
  constructor(
    @Inject(RESOLVED_OPTIONS) { claimCheck }: ResolvedOptions,
    @Inject(CLAIM_CHECK_STORES) private readonly stores: ClaimCheckStores,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    private readonly metrics: ClaimCheckMetrics,
    events: SequenceEvents,
  ) {
    this.options = claimCheck;
    this.lifecycle = new ClaimCheckLifecycle(events);
  }

  /**
   * Warns, once, when tickets are signed and verified with a key made for this process only
   * while the transport reaches other processes: they refuse each other's tickets. Called when a
   * `@ClaimCheck` handler is bound, and when the first ticket is signed, so that an application
   * that uses no Claim Check hears nothing of it.
   */
  warnIfKeysAreLocal(): void {
    if (this.keysWarned || !this.options.ephemeralKeys || this.transport.name === 'in-memory') {
      return;
    }
    this.keysWarned = true;
    this.logger.warn(
      `claimCheck.signingKeys is not set: tickets are signed with a key made for this process ` +
        `only, and other processes on the ${this.transport.name} transport will refuse them ` +
        `(unknown-key); configure the same keys on every sender and receiver`,
    );
  }

  onApplicationShutdown(): void {
    this.stopped = true;
  }

  /** Where new payloads go. */
  get store(): PayloadStore {
    return this.stores.store;
  }

  /**
   * Streams `payload` into the store (never buffering a Readable whole) and signs its ticket for
   * the channels of `audience` (none: for `checkOut` by hand only). `published: false` marks it an
   * orphan-to-be until `markPublished` (see OrphanSweeper). With `fragment`, the ticket is a
   * Message Sequence fragment's, for that fragment only.
   * @throws ClaimTicketInvalidError (`expired`) when storing took past the ticket's ttl: the
   * payload is deleted again; the store's error; PayloadStoreTimeoutError when the store held the
   * upload up for `writeTimeoutMs` (`put`, see uploadPayload), or when a slow upload could not be
   * marked published within `readTimeoutMs` (`markPublished`)
   */
  async park(
    payload: Buffer | Readable,
    options: ParkOptions,
    published: boolean,
    audience: readonly string[],
    fragment?: TicketFragment,
  ): Promise<ClaimTicket> {
    const store = this.stores.store;
    const startedAt = this.lifecycle.clock();
    const now = Date.now();
    const expiresAt = now + (options.ttlMs ?? this.options.ttlMs);
    const putOptions = {
      now,
      expiresAt,
      published,
      contentType: options.contentType,
      metadata: options.metadata,
    };
    const { ref, ...digest } = await uploadPayload(
      store,
      payload,
      putOptions,
      this.options.writeTimeoutMs,
      (late) => this.deleteLate(store, late.ref, published),
    );
    this.warnIfKeysAreLocal();
    let ticket: ClaimTicket;
    try {
      assertUnexpired(expiresAt, now);
      ticket = signTicket(
        {
          store: store.name,
          ref,
          ...digest,
          contentType: options.contentType,
          expiresAt,
          audience,
          ...fragment,
        },
        this.options.keyring,
      );
      if (!published) await this.markIfStoredSlowly(store, ref, now);
    } catch (error) {
      // A ticket that cannot be made (a store's ref too long for one, say, or one that expired
      // while the payload was stored) leaves a payload no one can claim, and a checked-in one no
      // sweeper takes before its expiry: delete it now. So does a slow upload left unmarked.
      // Unanswered, it is left to the orphan sweeper (or, marked, to its expiry).
      await this.storeCallWithin(store, ref, 'delete', store.delete(ref)).catch(() => undefined);
      throw error;
    }
    this.metrics.checkedIn(store.name, digest.bytes);
    this.lifecycle.checkedIn(ticket, audience, startedAt);
    return ticket;
  }

  /**
   * An unpublished payload is an orphan `orphanGraceMs` after its upload began (the `createdAt`
   * its store records), and the module leaves its ticket's publish at most half of that grace. An
   * upload that took the other half or more leaves the publish less than it may need: a sweep
   * could delete the payload while its ticket is on its way. Such a payload is marked published
   * before its ticket is sent: a failed publish still deletes it (`settle`), and a process that
   * dies before then leaves it to its expiry instead.
   * @throws the store's error, PayloadStoreTimeoutError when it did not answer within
   * `readTimeoutMs`, or ClaimCheckNotFoundError when it was swept already
   */
  private async markIfStoredSlowly(
    store: PayloadStore,
    ref: string,
    startedAt: number,
  ): Promise<void> {
    if (Date.now() - startedAt < this.options.orphanGraceMs / 2) return;
    const marked = await this.storeCallWithin(
      store,
      ref,
      'markPublished',
      store.markPublished(ref),
    );
    if (!marked) throw new ClaimCheckNotFoundError(store.name, ref);
  }

  /**
   * Parses and verifies a ticket message body (or an already parsed ticket), whatever its
   * audience: for a caller that consumes no channel (`checkOut`, `release`).
   * @throws ClaimTicketInvalidError, UnknownPayloadStoreError
   */
  resolve(ticket: unknown, now: number = Date.now()): ResolvedTicket {
    const candidate = Buffer.isBuffer(ticket) ? parseTicketBody(ticket) : ticket;
    const verified = verifyTicket(candidate, this.options.keyring, now);
    return { ticket: verified, store: this.storeNamed(verified.store) };
  }

  /**
   * {@link resolve}, for a ticket taken on `channel`: it must have been issued for the channel
   * (or name none, while `acceptTicketsWithoutAudience` is on). Checked before its store is
   * looked up, so that a replayed ticket touches neither the store nor the claim ledger.
   * @throws ClaimTicketInvalidError, ClaimTicketAudienceError, UnknownPayloadStoreError
   */
  resolveOn(channel: string, ticketBody: Buffer): ResolvedTicket {
    const verified = verifyTicket(parseTicketBody(ticketBody), this.options.keyring, Date.now());
    checkTicketAudience(verified, channel, this.options.acceptTicketsWithoutAudience);
    return { ticket: verified, store: this.storeNamed(verified.store) };
  }

  /**
   * {@link resolveOn} for a ticket it refused `expired`: the same checks but the expiry, so that
   * the receiver can ask the claim ledger whether the copy is a duplicate of a handled one.
   * @throws ClaimTicketInvalidError, ClaimTicketAudienceError, UnknownPayloadStoreError
   */
  resolveExpiredOn(channel: string, ticketBody: Buffer): ResolvedTicket {
    const verified = verifyTicketSignature(parseTicketBody(ticketBody), this.options.keyring);
    checkTicketAudience(verified, channel, this.options.acceptTicketsWithoutAudience);
    return { ticket: verified, store: this.storeNamed(verified.store) };
  }

  /**
   * A small payload (a fragment body) read whole, checked against its ticket. A store that does
   * not answer within `readTimeoutMs` (opening it, or with its next chunk) fails the read, and
   * what it opened is destroyed: a stalled store must not hold the message for ever.
   * @throws ClaimCheckNotFoundError, ClaimCheckIntegrityError, PayloadReadTimeoutError, or the
   * store's error
   */
  async readWhole({ ticket, store }: ResolvedTicket, channel = ''): Promise<Buffer> {
    const startedAt = this.lifecycle.clock();
    const chunks: Buffer[] = [];
    let read = 0;
    const source = sourceChunks(
      (signal) => store.get(ticket.ref, { signal }),
      () => undefined, // what fails the read is thrown to the caller
      this.readBound(store, ticket.ref),
    );
    for await (const chunk of source) {
      chunks.push(chunk);
      read += chunk.length;
      // More than the ticket says: wrong bytes, and no reason to hold them all (the loop's end
      // destroys the store's stream).
      if (read > ticket.bytes) break;
    }
    const body = Buffer.concat(chunks);
    const actual = { sha256: sha256Hex(body), bytes: body.length };
    if (actual.bytes !== ticket.bytes || actual.sha256 !== ticket.sha256) {
      throw new ClaimCheckIntegrityError(
        store.name,
        ticket.ref,
        { sha256: ticket.sha256, bytes: ticket.bytes },
        actual,
      );
    }
    this.metrics.checkedOut(store.name);
    this.lifecycle.checkedOut(channel, ticket, startedAt);
    return body;
  }

  /**
   * The payload's info from its store, given up on after `readTimeoutMs`.
   * @throws PayloadReadTimeoutError, or the store's error
   */
  headWithin(store: PayloadStore, ref: string): Promise<PayloadInfo | undefined> {
    return payloadHeadWithin(store, ref, this.options.readTimeoutMs);
  }

  /**
   * A `markPublished` or `delete` on `store` (a consumer's, or a publish's after its upload),
   * given up on after `readTimeoutMs` (`PayloadStoreTimeoutError`): a store that stopped
   * answering must not hold the message, nor the publish.
   */
  storeCallWithin<T>(
    store: PayloadStore,
    ref: string,
    call: PayloadStoreCall,
    pending: Promise<T>,
  ): Promise<T> {
    return storeCallWithin(store, ref, call, pending, this.options.readTimeoutMs);
  }

  /** Longest wait on a store for one step of a read (`claimCheck.readTimeoutMs`). */
  get readTimeoutMs(): number {
    return this.options.readTimeoutMs;
  }

  private readBound(store: PayloadStore, ref: string): StallBound {
    const { readTimeoutMs } = this.options;
    return {
      ms: readTimeoutMs,
      error: (waitingFor) =>
        new PayloadReadTimeoutError(store.name, ref, waitingFor, readTimeoutMs),
    };
  }

  /**
   * After the ticket's publish: marks the payload published (a few tries: unmarked, it would be
   * swept as an orphan after `orphanGraceMs`), or deletes it when the publish failed (else the
   * orphan sweeper will). Never throws; failures are logged. Each store call is given up on
   * after `readTimeoutMs`, and counts as failed: a store that stopped answering delays the
   * publish by that much at most.
   */
  async settle(ticket: ClaimTicket, published: boolean): Promise<void> {
    const store = this.storeNamed(ticket.store);
    const what = `${store.name}:${ticket.ref}`;
    if (!published) {
      await this.storeCallWithin(store, ticket.ref, 'delete', store.delete(ticket.ref))
        .then((deleted) => {
          const channel = audienceChannel(ticket.audience?.[0] ?? '');
          if (deleted) this.lifecycle.deleted(channel, store.name, ticket.ref, 'publish-failed');
        })
        .catch((error: unknown) =>
          this.logger.warn(
            `could not delete payload ${what} after its ticket failed to publish; the orphan ` +
              `sweeper will: ${errorMessage(error)}`,
          ),
        );
      return;
    }
    // Unmarked, it would be swept as an orphan after `orphanGraceMs` while its ticket may still
    // be queued: a few quick tries, then keep trying in the background for half the grace.
    if (await this.tryMarkPublished(store, ticket.ref)) return;
    const giveUpAt = Date.now() + this.options.orphanGraceMs / 2;
    void (async () => {
      for (let attempt = 1; Date.now() < giveUpAt; attempt++) {
        // Unref'd, and over at shutdown: a retry must not keep the process alive.
        await new Promise((resolve) =>
          setTimeout(resolve, Math.min(30_000, 1_000 * attempt)).unref(),
        );
        if (this.stopped) return;
        if (await this.tryMarkPublished(store, ticket.ref)) return;
      }
      this.logger.error(
        `the ticket for ${what} was published but the payload could not be marked published; ` +
          `it will be swept as an orphan after orphanGraceMs (${this.options.orphanGraceMs} ms) ` +
          'unless consumed first',
      );
    })();
  }

  /**
   * A payload that a consumer of its ticket leaves in the store (its handler failed, or the
   * channel's retention keeps it for the others of its audience) and found unpublished: its
   * sender died between the broker's confirm and the mark, or its store failed for longer than
   * the sender kept trying. Its ticket is out, so it is no orphan: marked now, lest the sweeper
   * take it while its dead letter waits to be republished, or before the other channels had it.
   * Never throws: unmarked, it is swept as it would have been. Resolves true once marked.
   */
  async markDelivered(store: PayloadStore, ref: string, channel: string): Promise<boolean> {
    try {
      await this.storeCallWithin(store, ref, 'markPublished', store.markPublished(ref));
      return true;
    } catch (error) {
      this.logger.warn(
        `${channel}: could not mark ${store.name}:${ref} published, which its sender did not; ` +
          `it may be swept as an orphan: ${errorMessage(error)}`,
      );
      return false;
    }
  }

  /**
   * A few quick tries of the mark; resolves whether it was made. A store that does not answer
   * one within `readTimeoutMs` gets no quick retry: it would not answer the next in 100 ms.
   */
  private async tryMarkPublished(store: PayloadStore, ref: string): Promise<boolean> {
    for (let attempt = 1; attempt <= 3; attempt++) {
      try {
        const marked = this.storeCallWithin(store, ref, 'markPublished', store.markPublished(ref));
        if (!(await marked)) {
          // Gone before its ticket's publish was confirmed. Most often its consumers were faster
          // than the confirm: they handled the ticket and deleted the payload (its retention).
          // Otherwise it was swept as an orphan or deleted by hand, and its consumers will find
          // it gone. Which of the two, only the consumers' dead-letter channel can tell.
          this.logger.warn(
            `${store.name}:${ref} was gone when its ticket's publish was confirmed: its ` +
              'consumers handled it already and deleted it, or (if they dead-letter the ticket ' +
              'claim-check-not-found) it was deleted by hand or swept as an orphan, the store ' +
              'write and the publish together taking over orphanGraceMs',
          );
        }
        return true;
      } catch (error) {
        if (attempt === 3 || error instanceof PayloadStoreTimeoutError) {
          this.logger.warn(`could not mark ${store.name}:${ref} published: ${errorMessage(error)}`);
          return false;
        }
        await delay(100 * attempt);
      }
    }
    return false;
  }

  /**
   * A parked payload whose bytes were taken elsewhere (a fragment now in the sequence store):
   * deleted when the retention is `'ack'`, else left to expire. Never throws; a delete the store
   * does not answer within `readTimeoutMs` is given up on, and the payload left to expire.
   */
  async releaseParked({ ticket, store }: ResolvedTicket): Promise<void> {
    if (this.options.deleteAfter !== 'ack') return;
    try {
      if (await this.storeCallWithin(store, ticket.ref, 'delete', store.delete(ticket.ref))) {
        this.metrics.payloadDeleted(store.name, 'consumed');
        this.lifecycle.deleted(
          audienceChannel(ticket.audience?.[0] ?? ''),
          store.name,
          ticket.ref,
          'consumed',
        );
      }
    } catch (error) {
      this.logger.warn(
        `could not delete parked ${store.name}:${ticket.ref}; it expires at ` +
          `${new Date(ticket.expiresAt).toISOString()}: ${errorMessage(error)}`,
      );
    }
  }

  /**
   * A payload whose put was given up on (`PayloadStoreTimeoutError`) and stored all the same: no
   * ticket names it, so it is deleted. Unanswered, an unpublished one is left to the orphan
   * sweeper, a published one (`checkIn`) to its expiry.
   */
  private deleteLate(store: PayloadStore, ref: string, published: boolean): void {
    const what = `${store.name}:${ref}`;
    this.logger.warn(
      `the ${store.name} payload store answered a put given up on (writeTimeoutMs) with ${what}; ` +
        'no ticket names it: deleting it',
    );
    const deleting = (async () => store.delete(ref))();
    void this.storeCallWithin(store, ref, 'delete', deleting).then(
      (deleted) => {
        if (!deleted) return;
        this.metrics.payloadDeleted(store.name, 'orphaned');
        this.lifecycle.deleted('', store.name, ref, 'orphaned');
      },
      (error: unknown) =>
        this.logger.warn(
          `could not delete ${what}, stored after its put was given up on; ` +
            `${published ? 'it is deleted at its expiry' : 'the orphan sweeper will'}: ` +
            errorMessage(error),
        ),
    );
  }

  /** The store a ticket names. @throws UnknownPayloadStoreError */
  storeNamed(name: string): PayloadStore {
    const store = this.stores.stores.get(name);
    if (!store) throw new UnknownPayloadStoreError(name, [...this.stores.stores.keys()]);
    return store;
  }
}

/**
 * The ticket expires `ttlMs` after the upload began: one whose upload took longer would be
 * refused by every consumer (`expired`) while its sender took it for sent.
 * @throws ClaimTicketInvalidError (`expired`)
 */
function assertUnexpired(expiresAt: number, startedAt: number): void {
  const now = Date.now();
  if (expiresAt > now) return;
  throw new ClaimTicketInvalidError(
    'expired',
    `the payload took ${now - startedAt} ms to store, past its ttlMs ` +
      `(${expiresAt - startedAt} ms): its ticket would be refused on arrival`,
  );
}

/**
 * `pending`, a `call` on `store`, given up on after `ms` (`claimCheck.readTimeoutMs`) with a
 * `PayloadStoreTimeoutError`.
 */
export function storeCallWithin<T>(
  store: PayloadStore,
  ref: string,
  call: PayloadStoreCall,
  pending: Promise<T>,
  ms: number,
): Promise<T> {
  return withTimeout(pending, ms, () => new PayloadStoreTimeoutError(store.name, ref, call, ms));
}

/**
 * `store.head(ref)`, given up on after `ms` (`claimCheck.readTimeoutMs`) with a
 * `PayloadReadTimeoutError`: for the consumers, the service and the console alike.
 */
export function payloadHeadWithin(
  store: PayloadStore,
  ref: string,
  ms: number,
): Promise<PayloadInfo | undefined> {
  return withTimeout(
    store.head(ref),
    ms,
    () => new PayloadReadTimeoutError(store.name, ref, 'head', ms),
  );
}
