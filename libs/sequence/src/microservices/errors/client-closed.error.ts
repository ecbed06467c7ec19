import { SequenceError } from '../../core/errors/sequence.error';

/**
 * `send()` was still waiting for its reply when its `SequenceClient` closed (`close()`, or the
 * application's shutdown): the request may still be handled.
 */
export class ClientClosedError extends SequenceError {
  readonly code = 'client-closed' as const;

  constructor(
    readonly pattern: string,
    readonly correlationId: string,
  ) {
    super(
      `SequenceClient closed before the reply to ${pattern} (correlation id ${correlationId}) ` +
        'came; the request may still be handled: make its handler idempotent before sending it ' +
        'again',
    );
  }
}
