import { Readable } from 'node:stream';
import { crc32Continued } from '../../../core/checksum';
import { StoredFragmentIntegrityError } from '../../../core/errors/stored-fragment-integrity.error';
import { asError } from '../../../core/errors/caught';
import { StoredFragmentDecryptionError } from '../../../core/errors/stored-fragment-decryption.error';
import { SealedBufferFailure, type SealedBufferOpener } from '../../../core/sealed-buffer';

/**
 * One piece of a sequence's bytes: a whole body (`bytes` unknown: a small body, kept inline) or
 * the range `[start, start + bytes)` of a large one.
 */
export interface BodyPiece {
  readonly position: number;
  readonly start: number;
  /** The length the fetch must return; undefined when the body's length is not known. */
  readonly bytes?: number;
  /** On the last piece of a body: the CRC-32 the body was stored with. */
  readonly crc32?: number;
}

/** The error a read fails with when a body it planned to read is no longer there. */
export function bodyGoneError(position: number): Error {
  return new Error(
    `the body at position ${position} is gone: the sequence was finished or expired while it ` +
      'was being read',
  );
}

/**
 * Fetches a piece: its bytes in one Buffer or in several parts (views of a socket's chunks, read
 * without copying); null when it is not there.
 */
export type BodyFetcher = (piece: BodyPiece) => Promise<Buffer | readonly Buffer[] | null>;

/** For a store that encrypts: opens the sealed body at a position, as its pieces arrive. */
export type BodyOpenerFactory = (position: number) => SealedBufferOpener;

/**
 * The bytes of a sequence as a stream, in order: each piece in the one or more parts it was
 * fetched in, one chunk per part. At most `readAhead` pieces (at least one) are being fetched or
 * waiting, and a one-byte high-water mark keeps at most one part in the stream's buffer: a read
 * holds at most `readAhead + 2` pieces (the piece whose parts are being handed out, and the one
 * its consumer is handling), whatever the sequence's size. `open` resolves the pieces to read, in
 * order (or rejects: the stream fails). A piece that is missing, or shorter than planned, fails
 * the stream: the sequence was finished or expired while it was being read. Each body's CRC-32
 * is computed over its pieces and checked, before any part of its last piece is pushed, against
 * the one it was stored with: a mismatch fails the stream with a
 * {@link StoredFragmentIntegrityError}.
 *
 * With `openBody` (a store that encrypts), pieces are of the sealed body: they are decrypted as
 * they come and the CRC-32 is checked on the plaintext, after the body's authentication tag. A
 * body that does not decrypt fails the stream with a {@link StoredFragmentDecryptionError}.
 */
export class RedisBodyReader extends Readable {
  private readonly pending: Array<Promise<Buffer | readonly Buffer[] | null>> = [];
  private pieces?: readonly BodyPiece[];
  /** Index in `pieces` of the next one to fetch. */
  private next = 0;
  /** CRC-32 of the pieces of the current body fetched so far. */
  private running = 0;
  /** Parts of the last piece fetched that are not pushed yet: one is pushed per _read call. */
  private ready: Buffer[] = [];
  /** Opens the sealed body being read (with `openBody`). */
  private opener?: SealedBufferOpener;
  /**
   * Plaintext of a sealed body's pieces before its last: not authenticated until the tag is
   * checked at the body's end, so not released before then (at most one body's worth).
   */
  private heldBack: Buffer[] = [];
  /** _read was called and nothing was pushed since. */
  private wanted = false;
  private pumping = false;

  constructor(
    private readonly open: () => Promise<readonly BodyPiece[]>,
    private readonly fetch: BodyFetcher,
    private readonly readAhead: number,
    private readonly sequenceId: string,
    private readonly openBody?: BodyOpenerFactory,
  ) {
    super({ highWaterMark: 1 });
  }

  override _read(): void {
    this.wanted = true;
    if (this.pumping) return;
    this.pumping = true;
    // Not inside _read: a chunk pushed there would be joined, in a new Buffer, to the one a
    // paused-mode read() is about to return.
    queueMicrotask(() => void this.pump());
  }

  /**
   * Pushes one chunk per _read call, for as long as the stream keeps asking. One, not a piece's
   * parts at once: a consumer in paused mode (`read()`, `for await`) gets whatever the stream's
   * buffer holds joined into one new Buffer, a copy the parts exist to avoid.
   */
  private async pump(): Promise<void> {
    try {
      // Destroyed before its first read began: nothing to plan.
      if (this.destroyed) return;
      this.pieces ??= await this.open();
      while (this.wanted && !this.destroyed) {
        this.wanted = false;
        await this.pushNext();
      }
    } catch (error) {
      this.destroy(asError(error));
    } finally {
      this.pumping = false;
    }
  }

  private async pushNext(): Promise<void> {
    const part = this.ready.shift();
    if (part !== undefined) {
      this.push(part);
      return;
    }
    for (;;) {
      this.fill();
      const pieces = this.pieces ?? [];
      const piece = pieces[this.next - this.pending.length];
      const fetching = this.pending.shift();
      if (fetching === undefined) {
        // Ends only once every planned piece was fetched and pushed: never short.
        if (this.next < pieces.length) {
          throw new Error(`read of sequence ${this.sequenceId} stopped before its end`);
        }
        this.push(null);
        return;
      }
      const fetched = await fetching;
      if (this.destroyed) return;
      if (piece === undefined) throw new Error('a body was fetched for no planned piece');
      if (fetched === null) throw bodyGoneError(piece.position);
      const fetchedParts = Buffer.isBuffer(fetched) ? [fetched] : fetched;
      const bytes = fetchedParts.reduce((sum, part) => sum + part.length, 0);
      if (piece.bytes !== undefined && bytes !== piece.bytes) throw bodyGoneError(piece.position);
      const parts = this.openBody ? this.decrypted(piece, fetchedParts) : fetchedParts;
      let running = piece.start === 0 ? 0 : this.running;
      for (const part of parts) running = crc32Continued(part, running);
      this.running = running;
      if (piece.crc32 !== undefined && this.running !== piece.crc32) {
        throw new StoredFragmentIntegrityError(
          this.sequenceId,
          piece.position,
          piece.crc32,
          this.running,
        );
      }
      // An empty chunk would push nothing, nor end the stream: skip empty parts and bodies.
      this.ready = parts.filter((part) => part.length > 0);
      const first = this.ready.shift();
      if (first !== undefined) {
        this.push(first);
        return;
      }
    }
  }

  /**
   * The plaintext a sealed piece releases: nothing before the body's last piece, then the whole
   * body once its tag checked. GCM's plaintext is unauthenticated until then, and an altered
   * ciphertext byte alters the same plaintext byte: released early, it would reach the handler.
   */
  private decrypted(piece: BodyPiece, parts: readonly Buffer[]): Buffer[] {
    if (piece.start === 0) {
      this.opener = this.openBody?.(piece.position);
      this.heldBack = [];
    }
    const opener = this.opener;
    if (opener === undefined) throw new Error('a sealed body was read from its middle');
    try {
      for (const part of parts) this.heldBack.push(...opener.update(part));
      // Only a body's last piece carries its CRC-32.
      if (piece.crc32 === undefined) return [];
      const plaintext = [...this.heldBack, ...opener.final()];
      this.heldBack = [];
      return plaintext;
    } catch (error) {
      this.heldBack = [];
      if (!(error instanceof SealedBufferFailure)) throw error;
      throw new StoredFragmentDecryptionError(
        this.sequenceId,
        piece.position,
        piece.crc32 ?? Number.NaN,
        error.reason,
        error.keyId,
      );
    }
  }

  private fill(): void {
    const pieces = this.pieces ?? [];
    while (this.pending.length < this.readAhead && this.next < pieces.length) {
      const fetching = this.fetch(pieces[this.next++]);
      // Handled when awaited; until then a rejection must not count as unhandled.
      fetching.catch(() => undefined);
      this.pending.push(fetching);
    }
  }
}
