import { SequenceError } from './sequence.error';

/**
 * A ticket names a payload its store does not have: released, swept after expiry, or never
 * there. The message cannot succeed later, so it is dead-lettered, never requeued.
 */
export class ClaimCheckNotFoundError extends SequenceError {
  readonly code = 'claim-check-not-found' as const;

  constructor(
    readonly store: string,
    readonly ref: string,
  ) {
    super(
      `the ${store} payload store has no payload ${JSON.stringify(ref)}: it was released, ` +
        'swept after its expiry, or never stored; the ticket cannot be resolved',
    );
  }
}
