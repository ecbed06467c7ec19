import { Injectable } from '@nestjs/common';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import type { Resequencer } from '../resequencer/resequencer';

/** A resequencer of this application: who defined it, and whether the module consumes for it. */
export interface RegisteredResequencer {
  /** `ClassName.methodName`, or `ResequencerService.create`, for messages. */
  readonly definedBy: string;
  readonly resequencer: Resequencer;
  /** True for `@Resequenced` methods: the module subscribes to their channel. */
  readonly subscribed: boolean;
}

/** The resequencers of this application, by name (the gap sweeper runs over all of them). */
@Injectable()
export class ResequencerRegistry {
  private readonly byName = new Map<string, RegisteredResequencer>();

  add(entry: RegisteredResequencer): void {
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

  get(name: string): RegisteredResequencer | undefined {
    return this.byName.get(name);
  }

  all(): RegisteredResequencer[] {
    return [...this.byName.values()];
  }
}
