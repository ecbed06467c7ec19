import { Injectable } from '@nestjs/common';

/**
 * The module's consumers start in `onApplicationBootstrap` in two providers (the consumer host:
 * `@SequencedHandler`, `@ClaimCheck`, `@Resequenced`; the outbox runtime: relays and inbox), which
 * Nest runs together. When one fails, the application's init fails and Nest runs no shutdown hook:
 * the other must not go on consuming in an application that never started. Each registers how it
 * stops; the one that fails calls {@link abort}.
 */
@Injectable()
export class BootstrapAbort {
  private readonly stops: Array<() => Promise<void>> = [];
  private aborted = false;

  /** Whether a consumer of the module failed to start. */
  get isAborted(): boolean {
    return this.aborted;
  }

  onAbort(stop: () => Promise<void>): void {
    this.stops.push(stop);
  }

  /** Stops every consumer of the module (once); failures to stop are ignored. */
  async abort(): Promise<void> {
    if (this.aborted) return;
    this.aborted = true;
    await Promise.allSettled(this.stops.map((stop) => stop()));
  }
}
