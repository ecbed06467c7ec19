import { Readable } from 'node:stream';
import { asError } from '../../../core/errors/caught';

/**
 * Fetches chunk `index` (0-based): in one Buffer or in several parts (views of a socket's chunks,
 * read without copying); null when its key is gone.
 */
export type ChunkFetcher = (index: number) => Promise<Buffer | readonly Buffer[] | null>;

/**
 * The chunks of one payload as a byte stream, in order, each in the one or more parts it was
 * fetched in. At most `readAhead` chunks are being fetched or waiting, and a one-byte high-water
 * mark keeps at most one part in the stream's buffer: a read holds at most `readAhead + 2` chunks
 * (the one whose parts are being handed out, the one its consumer is handling), whatever the
 * payload's size. A chunk found missing (the payload was deleted or expired while being read)
 * destroys the stream with `gone(index)`.
 */
export class RedisChunkReader extends Readable {
  private readonly pending: Array<Promise<Buffer | readonly Buffer[] | null>> = [];
  /** Parts of the last chunk fetched that are not pushed yet: one is pushed per _read call. */
  private ready: Buffer[] = [];
  /** Index of the next chunk to fetch. */
  private next = 0;
  /** Index of the next chunk to push. */
  private delivered = 0;

  constructor(
    private readonly chunks: number,
    private readonly fetch: ChunkFetcher,
    private readonly readAhead: number,
    private readonly gone: (index: number) => Error,
  ) {
    super({ highWaterMark: 1 });
  }

  // Readable calls _read again only after a push, so one chunk is awaited at a time.
  override _read(): void {
    const part = this.ready.shift();
    if (part !== undefined) {
      // Not inside _read: a part pushed there would be joined, in a new Buffer, to the one a
      // paused-mode read() is about to return.
      queueMicrotask(() => {
        if (!this.destroyed) this.push(part);
      });
      return;
    }
    this.fill();
    const fetching = this.pending.shift();
    if (!fetching) {
      this.push(null);
      return;
    }
    const index = this.delivered++;
    fetching.then(
      (chunk) => {
        if (this.destroyed) return;
        if (chunk === null) {
          this.destroy(this.gone(index));
          return;
        }
        // Start the next fetch before handing this chunk over, so Redis works while we wait.
        this.fill();
        this.ready = (Buffer.isBuffer(chunk) ? [chunk] : [...chunk]).filter(
          (piece) => piece.length > 0,
        );
        const first = this.ready.shift();
        // An empty push would not call _read again; the store never writes empty chunks anyway.
        if (first === undefined) this._read();
        else this.push(first);
      },
      (error: unknown) => this.destroy(asError(error)),
    );
  }

  private fill(): void {
    while (this.pending.length < this.readAhead && this.next < this.chunks) {
      const fetching = this.fetch(this.next++);
      // Handled when its turn comes; until then (or if the stream is destroyed first) a
      // rejection must not count as unhandled.
      fetching.catch(() => undefined);
      this.pending.push(fetching);
    }
  }
}
