import { Readable } from 'node:stream';

/** Fetches the body at a position (1-based); null when it is not there. */
export type BodyFetcher = (position: number) => Promise<Buffer | null>;

/**
 * The bodies of a sequence as a byte stream, one chunk per body, in position order. At most
 * `readAhead` bodies (at least one) are being fetched or waiting to be pushed, and a one-byte
 * high-water mark keeps at most one body in the stream's buffer: a read holds at most
 * `readAhead + 2` bodies (with the one its consumer is handling), whatever the sequence's size. `open` resolves the positions to read, in order (or rejects: the stream fails).
 */
export class RedisBodyReader extends Readable {
  private readonly pending: Array<Promise<Buffer | null>> = [];
  private positions?: readonly number[];
  /** Index in `positions` of the next body to fetch. */
  private next = 0;
  /** _read was called and no body was pushed since. */
  private wanted = false;
  private pumping = false;

  constructor(
    private readonly open: () => Promise<readonly number[]>,
    private readonly fetch: BodyFetcher,
    private readonly readAhead: number,
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
      this.positions ??= await this.open();
      while (this.wanted && !this.destroyed) {
        this.wanted = false;
        await this.pushNext();
      }
    } catch (error) {
      this.destroy(error instanceof Error ? error : new Error(String(error)));
    } finally {
      this.pumping = false;
    }
  }

  private async pushNext(): Promise<void> {
    for (;;) {
      this.fill();
      const position = this.positions?.[this.next - this.pending.length];
      const body = await this.pending.shift();
      if (this.destroyed) return;
      if (body === undefined) {
        this.push(null);
        return;
      }
      if (body === null) {
        throw new Error(
          `the body at position ${position} is gone: the sequence was finished or expired while ` +
            'it was being read',
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
    const positions = this.positions ?? [];
    while (this.pending.length < Math.max(1, this.readAhead) && this.next < positions.length) {
      const fetching = this.fetch(positions[this.next++]);
      // Handled when awaited; until then a rejection must not count as unhandled.
      fetching.catch(() => undefined);
      this.pending.push(fetching);
    }
  }
}
