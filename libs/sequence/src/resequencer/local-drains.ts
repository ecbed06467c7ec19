/**
 * The drains this process runs, per key, and the input messages waiting for one of them to end.
 *
 * An input whose event was released while the key's lease was held elsewhere (`busy`) is acked
 * only once the drain that holds the lease has delivered and settled its event. When that drain
 * runs in this process, the input waits for it to end and then asks the store once; only when it
 * runs in another instance does the input ask the store every `pollMs`. Before, every waiting
 * input asked every 10 ms: on a hot key (a burst of one transfer's statuses, the fragments of one
 * streamed sequence) half of the prefetch could sit in those polls, each one a store call.
 *
 * Waking is only a hint to ask again: the store's answer decides, so a missed or early wake-up
 * costs a poll or a wait, never an event. A drain of this process is not always the lease's
 * holder (its lease may have lapsed while a handler ran, and another instance emptied the list
 * since): an input waiting on one still asks every `RUNNING_POLL_MS`.
 */
export const RUNNING_POLL_MS = 250;

export class LocalDrains {
  private readonly running = new Map<string, number>();
  private readonly waiting = new Map<string, Set<() => void>>();

  /** A drain of `key` holds its lease in this process from now until `end`. */
  begin(key: string): void {
    this.running.set(key, (this.running.get(key) ?? 0) + 1);
  }

  /** The drain begun for `key` has ended, however: wakes every input waiting on the key. */
  end(key: string): void {
    const left = (this.running.get(key) ?? 1) - 1;
    if (left > 0) this.running.set(key, left);
    else this.running.delete(key);
    const wakers = this.waiting.get(key);
    if (!wakers) return;
    this.waiting.delete(key);
    for (const wake of wakers) wake();
  }

  /** Whether a drain of `key` runs in this process now. */
  isRunning(key: string): boolean {
    return this.running.has(key);
  }

  /**
   * Resolves when a drain of `key` in this process ends, or after `pollMs` when none runs here
   * now (the lease is another instance's), or after `RUNNING_POLL_MS` when one does, and in any
   * case after `maxMs` at the latest.
   */
  wait(key: string, pollMs: number, maxMs: number): Promise<void> {
    const ms = Math.max(0, Math.min(this.isRunning(key) ? RUNNING_POLL_MS : pollMs, maxMs));
    return new Promise((resolve) => {
      let wakers = this.waiting.get(key);
      if (!wakers) this.waiting.set(key, (wakers = new Set()));
      const wake = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(() => {
        const set = this.waiting.get(key);
        set?.delete(wake);
        if (set?.size === 0) this.waiting.delete(key);
        resolve();
      }, ms);
      wakers.add(wake);
    });
  }
}
