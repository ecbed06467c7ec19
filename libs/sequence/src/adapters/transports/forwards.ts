import type { Logger } from '@nestjs/common';
import { errorMessage } from '../../core/errors/caught';

/**
 * The dead letters and copies at the tail a subscription is publishing in the background, each
 * acking its original after: closing waits for them (see {@link Forwards.settled}). Each forward
 * settles its message on every path; a failure past that is logged, never left to crash the
 * process as an unhandled rejection.
 */
export class Forwards {
  private readonly pending = new Set<Promise<void>>();

  constructor(
    private readonly channel: string,
    private readonly logger: Logger,
  ) {}

  add(forward: Promise<void>): void {
    const settled = forward.catch((error: unknown) =>
      this.logger.error(`forwarding a message of ${this.channel}: ${errorMessage(error)}`),
    );
    this.pending.add(settled);
    void settled.finally(() => this.pending.delete(settled));
  }

  /** Resolves once the forwards under way now have settled. */
  async settled(): Promise<void> {
    await Promise.allSettled([...this.pending]);
  }
}
