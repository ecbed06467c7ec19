import { SequenceError } from '../../../core/errors/sequence.error';

/**
 * The Redis payload store could not complete an operation for a reason that is not the
 * caller's source stream nor the Redis client's own error: for example chunks expired while a
 * long `put` was still writing (its `expiresAt` was too close), or a command answered something
 * unexpected. Nothing readable is left behind.
 */
export class RedisPayloadStoreError extends SequenceError {
  readonly code = 'redis-payload-store' as const;

  constructor(
    readonly operation: string,
    readonly ref: string,
    detail: string,
  ) {
    super(`redis payload store, ${operation} of payload ${ref}: ${detail}`);
  }
}
