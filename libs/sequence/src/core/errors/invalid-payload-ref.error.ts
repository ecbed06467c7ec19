import { SequenceError } from './sequence.error';

/**
 * A ref is not one the store could have generated (for example it would resolve outside the
 * filesystem store's root). Refs come from messages and are treated as untrusted input.
 */
export class InvalidPayloadRefError extends SequenceError {
  readonly code = 'invalid-payload-ref' as const;

  constructor(
    readonly store: string,
    readonly ref: string,
    readonly why: string,
  ) {
    super(`the ${store} payload store refuses ref ${JSON.stringify(ref)}: ${why}`);
  }
}
