import { Injectable } from '@nestjs/common';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import type { Resequencer } from './resequencer';

/** A resequencer of this application, and who defined it. */
export interface CatalogedResequencer {
  /** `ClassName.methodName`, or `ResequencerService.create`, for messages. */
  readonly definedBy: string;
  readonly resequencer: Resequencer;
}

/**
 * The resequencers of this application, by name: those of `@Resequenced` methods, of stream-mode
 * `@SequencedHandler`s and of `ResequencerService.create`. The gap sweeper runs over all of them;
 * names are unique (keys of one name share state in the store).
 */
@Injectable()
export class ResequencerCatalog {
  private readonly byName = new Map<string, CatalogedResequencer>();

  add(entry: CatalogedResequencer): void {
    const { name } = entry.resequencer;
    const existing = this.byName.get(name);
    if (existing) {
      throw new SequenceOptionsError(entry.definedBy, [
        `a resequencer named ${name} is already defined by ${existing.definedBy}; ` +
          'give one of them another name (or channel)',
      ]);
    }
    this.byName.set(name, entry);
  }

  get(name: string): CatalogedResequencer | undefined {
    return this.byName.get(name);
  }

  all(): CatalogedResequencer[] {
    return [...this.byName.values()];
  }
}
