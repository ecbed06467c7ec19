import type { BoxName } from '../ports/outbox-store.port';
import type { Logger } from '@nestjs/common';

/** How soon a cycle that failed while woken is tried again. */
const RETRY_AFTER_FAILURE_MS = 250;

/**
 * Runs one box's cycle (a relay's or an inbox processor's claim) whenever it is woken, and every
 * `pollIntervalMs` as a safety net. Cycles never overlap: a wake-up during a cycle runs one more
 * after it, so a record committed while a claim was looking is never left for the next poll. A
 * cycle that reports more work (a full batch) is followed by the next one at once.
 */
export class BoxLoop {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
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
  ) {}

  start(pollIntervalMs: number): void {
    this.stopped = false;
    this.timer = setInterval(() => this.wake(), pollIntervalMs);
    this.timer.unref();
    this.wake();
  }

  /** Asks for a cycle soon (now, or right after the one in progress). */
  wake(): void {
    if (this.stopped) return;
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = this.drain().finally(() => (this.running = undefined));
  }

  /** Resolves once no cycle is running or asked for (tests, shutdown). */
  async idle(): Promise<void> {
    while (this.running) await this.running;
  }

  /** No more cycles; resolves once the one in progress has settled. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    this.timer = undefined;
    clearTimeout(this.retry);
    this.retry = undefined;
    await this.idle();
  }

  private async drain(): Promise<void> {
    do {
      this.again = false;
      try {
        while (!this.stopped && (await this.cycle()));
      } catch (error) {
        // The store or the broker is away: the next wake-up or poll tries again. A wake-up that
        // came during the failed cycle (a commit) is kept: one more try shortly, not at the poll.
        this.logger.warn(`${this.name}: ${(error as Error).message ?? String(error)}`);
        if (this.again && !this.stopped) {
          this.retry ??= setTimeout(() => {
            this.retry = undefined;
            this.wake();
          }, RETRY_AFTER_FAILURE_MS);
          this.retry.unref();
        }
        return;
      }
    } while (this.again && !this.stopped);
  }
}
