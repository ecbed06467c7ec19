/** Released bodies kept per connection for the next large ones. */
const POOLED_BODIES = 4;

/** A released buffer is let go once this many bodies in a row were received without it. */
const POOLED_IDLE_TAKES = 16;

/**
 * Whole buffers of large message bodies a transport's socket tricks received in place, handed
 * out again once released ({@link recycleBody}) for bodies of at least half their size: a
 * consumer that releases each body once it has put it elsewhere then reuses the same few buffers,
 * already in memory, instead of having new ones allocated and collected. One pool per connection.
 * It keeps at most {@link POOLED_BODIES}, and lets go of one that {@link POOLED_IDLE_TAKES}
 * bodies in a row did not use: when the bodies' sizes change, buffers of the old size are not held
 * for the connection's lifetime.
 *
 * A buffer it hands out has a memory block of its own (`buffer`, at offset 0, at least `size`
 * bytes long), never initialised: the caller writes every byte before anything reads it.
 */
export class BodyPool {
  /** Oldest first, each with the number of bodies received since it was released. */
  private free: { readonly whole: Buffer; idle: number }[] = [];

  take(size: number): Buffer {
    let index = -1;
    for (let i = this.free.length - 1; i >= 0 && index === -1; i -= 1) {
      const length = this.free[i].whole.length;
      if (length >= size && length <= 2 * size) index = i;
    }
    const whole = index === -1 ? Buffer.allocUnsafeSlow(size) : this.free.splice(index, 1)[0].whole;
    for (const entry of this.free) entry.idle += 1;
    this.free = this.free.filter((entry) => entry.idle < POOLED_IDLE_TAKES);
    lent.set(whole.buffer, { pool: this, whole });
    return whole.length === size ? whole : whole.subarray(0, size);
  }

  give(whole: Buffer): void {
    this.free.push({ whole, idle: 0 });
    if (this.free.length > POOLED_BODIES) this.free.shift();
  }

  /** How many buffers it keeps, and their bytes (tests). */
  get kept(): { buffers: number; bytes: number } {
    return {
      buffers: this.free.length,
      bytes: this.free.reduce((sum, entry) => sum + entry.whole.length, 0),
    };
  }
}

/** Memory blocks of bodies handed out, not yet recycled: the pool and the whole buffer of each. */
const lent = new WeakMap<ArrayBufferLike, { readonly pool: BodyPool; readonly whole: Buffer }>();

/**
 * Gives a body a {@link BodyPool} handed out (any view of it) back to its pool, to be overwritten
 * by a later message: only for a body nothing refers to any more (the transport's
 * `releaseBody`). Does nothing for any other buffer; returns whether it took it.
 */
export function recycleBody(body: Uint8Array): boolean {
  const loan = lent.get(body.buffer);
  if (!loan) return false;
  lent.delete(body.buffer);
  loan.pool.give(loan.whole);
  return true;
}
