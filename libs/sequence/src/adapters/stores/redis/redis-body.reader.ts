import { Readable } from 'node:stream';
import { crc32Continued } from '../../../core/checksum';
import { StoredFragmentIntegrityError } from '../../../core/errors/stored-fragment-integrity.error';
import { asError } from '../../../core/errors/caught';

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

/** Fetches a piece; null when it is not there. */
export type BodyFetcher = (piece: BodyPiece) => Promise<Buffer | null>;

/**
 * The bytes of a sequence as a stream, one chunk per piece, in order. At most `readAhead` pieces
 * (at least one) are being fetched or waiting to be pushed, and a one-byte high-water mark keeps
 * at most one in the stream's buffer: a read holds at most `readAhead + 2` pieces (with the one
 * its consumer is handling), whatever the sequence's size. `open` resolves the pieces to read, in
 * order (or rejects: the stream fails). A piece that is missing, or shorter than planned, fails
 * the stream: the sequence was finished or expired while it was being read. Each body's CRC-32 is
 * computed over its pieces and checked, before its last piece is pushed, against the one it was
 * stored with: a mismatch fails the stream with a {@link StoredFragmentIntegrityError}.
 */
export class RedisBodyReader extends Readable {
  private readonly pending: Array<Promise<Buffer | null>> = [];
  private pieces?: readonly BodyPiece[];
  /** Index in `pieces` of the next one to fetch. */
  private next = 0;
  /** CRC-32 of the pieces of the current body fetched so far. */
  private running = 0;
  /** _read was called and no body was pushed since. */
  private wanted = false;
  private pumping = false;

  constructor(
    private readonly open: () => Promise<readonly BodyPiece[]>,
    private readonly fetch: BodyFetcher,
    private readonly readAhead: number,
    private readonly sequenceId: string,
  ) {
    super({ highWaterMark: 1 });
  }

  override _read(): void {
    this.wanted = true;
    if (!this.pumping) void this.pump();
  }

  /** Pushes one body per _read call, for as long as the stream keeps asking. */
  private async pump(): Promise<void> {
    this.pumping = true;
    try {
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
      const body = await fetching;
      if (this.destroyed) return;
      if (piece === undefined) throw new Error('a body was fetched for no planned piece');
      if (body === null || (piece.bytes !== undefined && body.length !== piece.bytes)) {
        throw bodyGoneError(piece.position);
      }
      this.running = crc32Continued(body, piece.start === 0 ? 0 : this.running);
      if (piece.crc32 !== undefined && this.running !== piece.crc32) {
        throw new StoredFragmentIntegrityError(
          this.sequenceId,
          piece.position,
          piece.crc32,
          this.running,
        );
      }
      // An empty chunk would push nothing: skip empty bodies.
      if (body.length > 0) {
        this.push(body);
        return;
      }
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
