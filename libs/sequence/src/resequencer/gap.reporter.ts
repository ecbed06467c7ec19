import { Inject, Injectable, Logger } from '@nestjs/common';
import { errorMessage } from '../core/errors/caught';
import type { GapEvent } from '../core/gap-event';
import { RESOLVED_OPTIONS } from '../kernel/tokens';
import type { ResolvedOptions } from '../options/resolved-options';

export type GapListener = (event: GapEvent) => void | Promise<void>;

/** Hands gap outcomes to the module's `onGap` and to `ResequencerService.onGap` listeners. */
@Injectable()
export class GapReporter {
  private readonly logger = new Logger('Resequencer');
  private readonly listeners = new Set<GapListener>();

  private readonly onGap?: GapListener;

  constructor(@Inject(RESOLVED_OPTIONS) options: ResolvedOptions) {
    this.onGap = options.resequencer.onGap;
  }

  /** Adds a listener; returns the function that removes it. */
  add(listener: GapListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Calls every listener; a listener that fails is logged, never propagated. */
  async report(event: GapEvent): Promise<void> {
    const listeners = this.onGap ? [this.onGap, ...this.listeners] : [...this.listeners];
    for (const listener of listeners) {
      try {
        await listener(event);
      } catch (error) {
        this.logger.error(
          `a gap listener failed on ${event.type} of ${event.resequencer}/${event.key}: ${errorMessage(error)}`,
        );
      }
    }
  }
}
