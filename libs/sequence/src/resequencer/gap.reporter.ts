import { Inject, Injectable, Logger } from '@nestjs/common';
import { errorMessage } from '../core/errors/caught';
import type { GapEvent } from './gap-event';
import { RESEQUENCER_OPTIONS } from './resequencer.constants';
import type { ResolvedResequencerModuleOptions } from './resequencer.options';

export type GapListener = (event: GapEvent) => void | Promise<void>;

/** Hands gap outcomes to the module's `onGap` and to `ResequencerService.onGap` listeners. */
@Injectable()
export class GapReporter {
  private readonly logger = new Logger('Resequencer');
  private readonly listeners = new Set<GapListener>();

  constructor(
    @Inject(RESEQUENCER_OPTIONS) private readonly options: ResolvedResequencerModuleOptions,
  ) {}

  /** Adds a listener; returns the function that removes it. */
  add(listener: GapListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Calls every listener; a listener that fails is logged, never propagated. */
  async report(event: GapEvent): Promise<void> {
    const listeners = this.options.onGap
      ? [this.options.onGap, ...this.listeners]
      : [...this.listeners];
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
