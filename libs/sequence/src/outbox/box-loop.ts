import type { BoxName } from '../ports/outbox-store.port';
import type { Logger } from '@nestjs/common';

/** How soon a cycle that failed while woken is tried again. */
const RETRY_AFTER_FAILURE_MS = 250;

/**
 * Runs one box's cycles (a relay's or an inbox processor's claims), up to `concurrency` at once,
 * whenever it is woken, and every `pollIntervalMs` as a safety net.
 *
 * A wake-up starts one more cycle when fewer than `concurrency` run, and otherwise asks for one
 * more after the first of them ends: a record committed while every claim was looking is never
 * left for the next poll, and one commit never starts several claims that would race for its rows
 * (all but one finding nothing). A cycle that reports more work (a full batch) is followed by
 * the next one at once.
 */
export class BoxLoop {
  private timer: NodeJS.Timeout | undefined;
  private readonly running = new Set<Promise<void>>();
  private again = false;
  /** Until start(): a wake-up before the outbox has fully started runs nothing. */
  private stopped = true;
  /** The one more try a wake-up during a failed cycle asked for. */
  private retry: NodeJS.Timeout | undefined;

  constructor(
    readonly box: BoxName,
    readonly name: string,
    /** One claim; resolves true when there may be more due at once. */
    private readonly cycle: () => Promise<boolean>,
    private readonly logger: Logger,
    /** Most cycles at once (the box's `concurrency`). */
    private readonly concurrency = 1,
  ) {}

  start(pollIntervalMs: number): void {
    this.stopped = false;
    this.timer = setInterval(() => this.wake(), pollIntervalMs);
    this.timer.unref();
    this.wake();
  }

  /** Asks for a cycle soon (now, or right after one in progress). */
  wake(): void {
    if (this.stopped) return;
    if (this.running.size >= this.concurrency) {
      this.again = true;
      return;
    }
    // This cycle starts after the wake-up: it answers any asked for before.
    this.again = false;
    const drain: Promise<void> = this.drain().finally(() => this.running.delete(drain));
    this.running.add(drain);
  }

  /** Resolves once no cycle is running or asked for (tests, shutdown). */
  async idle(): Promise<void> {
    while (this.running.size > 0) await Promise.all(this.running);
  }

  /** No more cycles; resolves once those in progress have settled. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    this.timer = undefined;
    clearTimeout(this.retry);
    this.retry = undefined;
    await this.idle();
  }

  private async drain(): Promise<void> {
    let more = true;
    while (more) {
      try {
        while (!this.stopped && (await this.cycle()));
      } catch (error) {
        // The store or the broker is away: the next wake-up or poll tries again. A wake-up that
        // came during the failed cycle (a commit) is kept: one more try shortly, not at the poll.
        this.logger.warn(`${this.name}: ${(error as Error).message ?? String(error)}`);
        if (this.again && !this.stopped) {
          this.again = false;
          this.retry ??= setTimeout(() => {
            this.retry = undefined;
            this.wake();
          }, RETRY_AFTER_FAILURE_MS);
          this.retry.unref();
        }
        return;
      }
      // One wake-up asked for during the cycles is answered by one more cycle, of this drain.
      more = this.again && !this.stopped;
      this.again = false;
    }
  }
}
