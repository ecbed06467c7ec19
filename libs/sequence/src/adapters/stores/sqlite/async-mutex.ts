/**
 * A first-come, first-served lock for async code: `acquire()` resolves, in call order, once every
 * earlier holder has released. The SQLite store holds it around each use of its one connection,
 * whose transactions cannot overlap.
 */
export class AsyncMutex {
  private locked = false;
  private readonly waiting: Array<() => void> = [];

  /** Resolves with the function that releases the lock (calling it again does nothing). */
  async acquire(): Promise<() => void> {
    if (this.locked) {
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    } else {
      this.locked = true;
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.handOver();
    };
  }

  /** Whether someone holds the lock now. */
  get isLocked(): boolean {
    return this.locked;
  }

  /** The lock passes straight to the next waiter, so that no later caller can jump the queue. */
  private handOver(): void {
    const next = this.waiting.shift();
    if (next) next();
    else this.locked = false;
  }
}
