import type { BoxName } from '../ports/outbox-store.port';
import type { Logger } from '@nestjs/common';
import { errorMessage } from '../core/errors/caught';

/** How soon a cycle that failed while woken is tried again. */
const RETRY_AFTER_FAILURE_MS = 250;

/** Tells the loop that a cycle has locked its batch (and goes on to handle it). */
export type Locked = () => void;

/**
 * What may start a claim beside those running. `on-wake`: a wake-up, or a claim that took a full
 * batch. `when-behind`: only a claim that took a full batch (the box is behind); a wake-up while
 * a claim runs waits for it to end and is answered by one claim after it, which takes everything
 * committed meanwhile. A claim's own costs (its statements, its commit, the broker's confirms)
 * are then paid once per larger batch, and the claims widen to `concurrency` only on a backlog.
 */
export type Widening = 'on-wake' | 'when-behind';

/**
 * Runs one box's cycles (a relay's or an inbox processor's claims), up to `concurrency` at once,
 * whenever it is woken, and every `pollIntervalMs` as a safety net.
 *
 * A wake-up starts one more cycle when fewer than `concurrency` run, none is still locking its
 * batch, and the loop's `widening` allows it (see Widening); otherwise it asks for one more,
 * started as soon as the locking cycle has its batch (when wake-ups widen) or after the first
 * cycle that ends: a record committed while every claim was looking is never left for the
 * next poll, and commits never start claims that would race for the same rows (all but one
 * finding nothing). Claims then take what was committed while the one before them locked, in one
 * batch. A cycle that reports more work (a full batch) is followed by the next one at once, and
 * starts one more beside it when fewer than `concurrency` run and none is locking: a backlog
 * (rows committed while no relay ran) is drained by all the claims allowed, not by one until a
 * commit in this process wakes the loop.
 */
export class BoxLoop {
  private timer: NodeJS.Timeout | undefined;
  private readonly running = new Set<Promise<void>>();
  /** Drains started, counted before their first cycle runs (which may start another). */
  private drains = 0;
  private again = false;
  /** Cycles that have not locked their batch yet. */
  private locking = 0;
  /** Until start(): a wake-up before the outbox has fully started runs nothing. */
  private stopped = true;
  /** The one more try a wake-up during a failed cycle asked for. */
  private retry: NodeJS.Timeout | undefined;

  constructor(
    readonly box: BoxName,
    readonly name: string,
    /**
     * One claim; resolves true when there may be more due at once. It calls `locked` once it
     * has its batch; a cycle that does not is taken to lock until it ends.
     */
    private readonly cycle: (locked: Locked) => Promise<boolean>,
    private readonly logger: Logger,
    /** Most cycles at once (the box's `concurrency`). */
    private readonly concurrency = 1,
    private readonly widening: Widening = 'on-wake',
  ) {}

  start(pollIntervalMs: number): void {
    this.stopped = false;
    this.timer = setInterval(() => this.wake(), pollIntervalMs);
    this.timer.unref();
    this.wake();
  }

  /** Asks for a cycle soon (now, right after the one locking, or after one in progress). */
  wake(): void {
    if (this.stopped) return;
    if (!this.mayStart() || !this.mayWiden()) {
      this.again = true;
      return;
    }
    this.startDrain();
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

  /** Whether a cycle may start now: a slot is free and none is still locking its batch. */
  private mayStart(): boolean {
    return this.drains < this.concurrency && this.locking === 0;
  }

  /** Whether a wake-up may add a cycle to those running (always when none runs). */
  private mayWiden(): boolean {
    return this.drains === 0 || this.widening === 'on-wake';
  }

  /** One more drain beside those running, if one may start: a full batch (a backlog). */
  private spread(): void {
    if (!this.stopped && this.mayStart()) this.startDrain();
  }

  private startDrain(): void {
    // This cycle starts after the wake-up: it answers any asked for before.
    this.again = false;
    this.drains += 1;
    const drain: Promise<void> = this.drain().finally(() => this.running.delete(drain));
    this.running.add(drain);
  }

  /** One cycle, counted as locking until it says it has its batch (or ends). */
  private async runCycle(): Promise<boolean> {
    this.locking += 1;
    let done = false;
    const locked: Locked = () => {
      if (done) return;
      done = true;
      this.locking -= 1;
      // A wake-up while it locked: something was committed that it may not have seen. Asked
      // again now that none locks: one more claim now, for what it did not take, where a
      // wake-up may start one (else after the first that ends).
      if (this.again) this.wake();
    };
    try {
      return await this.cycle(locked);
    } finally {
      if (!done) {
        done = true;
        this.locking -= 1;
      }
    }
  }

  /**
   * Cycles until none reports more and no wake-up asked for one. Its slot is given back in the
   * same step as its last look at `again` (no await between): a wake-up right after it finds the
   * slot free, and starts a drain of its own.
   */
  private async drain(): Promise<void> {
    let more = true;
    try {
      while (more) {
        try {
          while (!this.stopped && (await this.runCycle())) this.spread();
        } catch (error) {
          // The store or the broker is away: the next wake-up or poll tries again. A wake-up
          // that came during the failed cycle (a commit) is kept: one more try shortly, not at
          // the poll.
          this.logger.warn(`${this.name}: ${errorMessage(error)}`);
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
    } finally {
      this.drains -= 1;
    }
  }
}
