import { SequenceError } from '../../../core/errors/sequence.error';

/**
 * The Redis sequence store could not complete an operation: a script answered something this
 * version does not understand (scripts and code out of step), or an accept kept racing other
 * instances past its retry budget. The aggregator requeues the fragment, as for any store error.
 */
export class RedisSequenceStoreError extends SequenceError {
  readonly code = 'redis-store' as const;

  constructor(
    readonly operation: string,
    readonly sequenceId: string,
    detail: string,
  ) {
    super(`redis sequence store, ${operation} of sequence ${sequenceId}: ${detail}`);
  }
}
