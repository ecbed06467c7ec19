import { SequenceError } from '../../../core/errors/sequence.error';

/**
 * The Redis resequencer store could not make sense of what Redis holds or answered: a script
 * replied something this version does not understand (the Lua files and the code are out of
 * step: deploy them together), or a stored entry or hand-off item is corrupt. The resequencer
 * requeues the message, as for any store error; a corrupt item stays where it is for inspection.
 */
export class RedisResequencerStoreError extends SequenceError {
  readonly code = 'redis-resequencer-store' as const;

  constructor(
    readonly operation: string,
    readonly scope: string,
    /** The resequencer key concerned; absent for scope-wide operations. */
    readonly key: string | undefined,
    detail: string,
    options?: { cause?: unknown },
  ) {
    super(
      `redis resequencer store, ${operation} of ` +
        `${key === undefined ? '' : `key ${JSON.stringify(key)} in `}scope ` +
        `${JSON.stringify(scope)}: ${detail}`,
      options,
    );
  }
}
