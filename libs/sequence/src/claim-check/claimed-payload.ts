import { Readable } from 'node:stream';
import type { ClaimTicket } from '../core/claim-ticket';
import { sha256Hasher, sha256Hex } from '../core/checksum';
import { ClaimCheckIntegrityError } from '../core/errors/claim-check-integrity.error';
import { PayloadReadTimeoutError } from '../core/errors/payload-read-timeout.error';
import type { HeaderMap } from '../core/headers';
import { sourceChunks, type StallBound } from '../core/source-chunks';
import type { ReassembledSequence } from '../kernel/pattern-contracts';

/**
 * How a payload travelled: in the message itself, parked in a payload store behind a ticket, or
 * as a Message Sequence (`mode: 'auto'` sends mid-sized payloads that way).
 */
export type ClaimDelivery = 'inline' | 'ticket' | 'sequence';

interface ClaimedPayloadInit {
  readonly via: ClaimDelivery;
  readonly bytes: number;
  readonly sha256: string;
  readonly fragments: number;
  readonly contentType?: string;
  readonly headers: HeaderMap;
  readonly metadata?: Readonly<Record<string, string>>;
  readonly ticket?: ClaimTicket;
  readonly sequenceId?: string;
}

/**
 * A payload as a `@ClaimCheck` handler (or `checkOut`) receives it, whichever way it travelled.
 * For a ticket the bytes stay in the payload store until you read them, and are checked against
 * the ticket's SHA-256 and byte count as they stream: `stream()` errors at its end, instead of
 * ending, on a mismatch, and `toBuffer()` rejects. Treat what you read as untrusted until the
 * stream ended.
 */
export class ClaimedPayload {
  readonly via: ClaimDelivery;
  readonly bytes: number;
  /**
   * SHA-256 of the payload, lowercase hex: of the body inline, the verified declaration of a
   * sequence, the ticket's for a ticket (which `stream()` checks the bytes against).
   */
  readonly sha256: string;
  /** Messages the payload travelled in: a sequence's fragment count, else 1. */
  readonly fragments: number;
  readonly contentType?: string;
  /** The message's own headers (those given to `publish()`). */
  readonly headers: Readonly<HeaderMap>;
  /** What the sender stored with the payload (`checkIn(..., { metadata })`); empty inline. */
  readonly metadata: Readonly<Record<string, string>>;
  /** The verified ticket, when the payload travelled behind one. */
  readonly ticket?: ClaimTicket;
  /** The sequence id, when the payload travelled as a Message Sequence. */
  readonly sequenceId?: string;
  private mismatch?: ClaimCheckIntegrityError;
  private readError?: Error;
  /** Streams handed out by `stream()`, so that what a handler left half-read is closed. */
  private readonly streams = new Set<Readable>();
  /** What those streams opened underneath (a file handle, a store's socket), not yet closed. */
  private readonly sources = new Set<Readable>();
  /** Set by `close()`: the handler returned, and nothing read after says anything about it. */
  private closed = false;
  /**
   * The reads of the current handler call: aborted by `closeStreams()` (a retry is next) and by
   * `close()`. A store still opening the payload for it gives up and closes what it opened, and
   * what its streams report no longer says anything about the payload.
   */
  private reads = new AbortController();

  private constructor(
    init: ClaimedPayloadInit,
    private readonly open: (signal: AbortSignal) => Promise<Readable>,
    /** How long a read waits on the store (opening, each next chunk); unbounded without. */
    private readonly stall?: StallBound,
  ) {
    this.via = init.via;
    this.bytes = init.bytes;
    this.sha256 = init.sha256;
    this.fragments = init.fragments;
    this.contentType = init.contentType;
    this.headers = Object.freeze({ ...init.headers });
    this.metadata = Object.freeze({ ...init.metadata });
    this.ticket = init.ticket;
    this.sequenceId = init.sequenceId;
  }

  /** A payload that came as a Message Sequence, reassembled and verified by the aggregator. */
  static sequence(reassembled: ReassembledSequence): ClaimedPayload {
    return new ClaimedPayload(
      {
        via: 'sequence',
        bytes: reassembled.bytes,
        sha256: reassembled.sha256,
        fragments: reassembled.fragments,
        contentType: reassembled.contentType,
        headers: reassembled.headers,
        sequenceId: reassembled.sequenceId,
      },
      () => Promise.resolve(reassembled.stream()),
    );
  }

  /** A payload that came in the message body. */
  static inline(body: Buffer, headers: HeaderMap, contentType?: string): ClaimedPayload {
    return new ClaimedPayload(
      {
        via: 'inline',
        bytes: body.length,
        sha256: sha256Hex(body),
        fragments: 1,
        contentType,
        headers,
      },
      // A copy per read: a handler that changes its bytes in place, then fails, must not hand
      // its retry the changed ones.
      () => Promise.resolve(Readable.from([Buffer.from(body)], { objectMode: false })),
    );
  }

  /**
   * A payload behind a verified ticket; `open` reads it from its store, and a store that does not
   * answer within `readTimeoutMs` (opening it, or with its next chunk) fails the read with
   * PayloadReadTimeoutError.
   */
  static resolved(
    ticket: ClaimTicket,
    headers: HeaderMap,
    metadata: Readonly<Record<string, string>> | undefined,
    open: (signal: AbortSignal) => Promise<Readable>,
    readTimeoutMs: number,
  ): ClaimedPayload {
    return new ClaimedPayload(
      {
        via: 'ticket',
        bytes: ticket.bytes,
        sha256: ticket.sha256,
        fragments: 1,
        contentType: ticket.contentType,
        headers,
        metadata,
        ticket,
      },
      open,
      {
        ms: readTimeoutMs,
        error: (waitingFor) =>
          new PayloadReadTimeoutError(ticket.store, ticket.ref, waitingFor, readTimeoutMs),
      },
    );
  }

  /** The bytes, in order; for a ticket, read from the store and verified as they flow. */
  stream(): Readable {
    const ticket = this.ticket;
    const reads = this.reads.signal;
    const abandoned = () => this.closed || reads.aborted;
    const record = (error: Error) => {
      if (!abandoned()) this.readError ??= error;
    };
    const onMismatch = (error: ClaimCheckIntegrityError) => {
      this.mismatch ??= error;
    };
    // A read that went through to a verified end got the payload: an earlier failed read (a
    // store that was briefly unreachable) no longer says anything about it.
    const onVerified = () => {
      if (!abandoned()) this.readError = undefined;
    };
    // `given up`: aborted when the store took past the stall bound to open it.
    const open = async (givenUp?: AbortSignal): Promise<Readable> => {
      const source = await this.open(givenUp ? AbortSignal.any([reads, givenUp]) : reads);
      if (abandoned()) {
        source.destroy();
      } else {
        this.sources.add(source);
        source.once('close', () => this.sources.delete(source));
      }
      return source;
    };
    const chunks = verifying(open, ticket, record, onMismatch, onVerified, this.stall);
    const stream = Readable.from(chunks, {
      objectMode: false,
      highWaterMark: 1,
    });
    this.streams.add(stream);
    stream.once('close', () => this.streams.delete(stream));
    return stream;
  }

  /**
   * Closes what `stream()` opened and was not read to its end (a handler that read part of the
   * payload), so store connections and file handles are not held. Called after the handler.
   */
  close(): void {
    this.closed = true;
    this.closeStreams(new Error('the payload was closed: its handler is done with it'));
  }

  /**
   * @internal Closes what `stream()` opened so far, as `close()` does, but leaves the payload
   * readable: a later `stream()` opens it anew. Called once a handler call failed (or timed out),
   * so that what it left half-read is not held open through the backoff and the next call, nor
   * read on by the abandoned call.
   */
  closeStreams(reason: Error = new Error('the handler call that read the payload is over')): void {
    const reads = this.reads;
    this.reads = new AbortController();
    reads.abort(reason);
    // The store's streams first and at once: the generator reading one may be waiting on its next
    // chunk, and would only stop (and destroy it) once that chunk came.
    for (const stream of [...this.sources, ...this.streams]) {
      // Nobody listens any more: an error now (e.g. "premature close") must not go unhandled.
      stream.on('error', () => undefined);
      stream.destroy();
    }
    this.sources.clear();
    this.streams.clear();
  }

  /** The whole payload in one Buffer; rejects when the bytes do not match the ticket. */
  async toBuffer(): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const chunk of this.stream()) chunks.push(chunk as Buffer);
    return Buffer.concat(chunks);
  }

  /** Set when a read found other bytes than the ticket names. */
  get integrityFailure(): ClaimCheckIntegrityError | undefined {
    return this.mismatch;
  }

  /** Set when the store could not be read (missing payload, outage), until a read succeeds. */
  get readFailure(): Error | undefined {
    return this.readError;
  }
}

async function* verifying(
  open: (givenUp?: AbortSignal) => Promise<Readable>,
  ticket: ClaimTicket | undefined,
  onReadError: (error: Error) => void,
  onMismatch: (error: ClaimCheckIntegrityError) => void,
  onVerified: () => void,
  stall: StallBound | undefined,
): AsyncGenerator<Buffer> {
  const hash = ticket ? sha256Hasher() : undefined;
  let bytes = 0;
  const mismatch = (sha256: string) => {
    // The expectation alone, not the ticket: the error's typed field says what it holds.
    const expected = { sha256: ticket!.sha256, bytes: ticket!.bytes };
    const error = new ClaimCheckIntegrityError(ticket!.store, ticket!.ref, expected, {
      sha256,
      bytes,
    });
    onMismatch(error);
    return error;
  };
  let verified = false;
  // Only what the store's stream throws is a read failure (see sourceChunks).
  for await (const chunk of sourceChunks(open, onReadError, stall)) {
    hash?.update(chunk);
    bytes += chunk.length;
    // More than the ticket says: stop here rather than hand (or buffer) all of it.
    if (ticket && bytes > ticket.bytes) throw mismatch(hash!.digest('hex'));
    if (ticket && bytes === ticket.bytes) {
      // The last byte the ticket promises is checked before it is handed out: a reader that stops
      // at the declared size never asks for the stream's end. A mismatch is withheld until that
      // end, so that the store's own error (a decryption that failed) comes first if it has one.
      if (hash!.copy().digest('hex') !== ticket.sha256) continue;
      verified = true;
      onVerified();
    }
    yield chunk;
  }
  if (verified) return; // at the ticket's last byte, and nothing came after it
  if (!ticket || !hash) return onVerified();
  const sha256 = hash.digest('hex');
  if (sha256 !== ticket.sha256 || bytes !== ticket.bytes) throw mismatch(sha256);
  onVerified();
}
