import { SequenceError } from '../../../core/errors/sequence.error';

/**
 * A claim ledger script answered something this version does not understand: the Lua files
 * and the code are out of step (deploy them together). The consumer requeues the message, as
 * for any ledger error.
 */
export class RedisClaimLedgerError extends SequenceError {
  readonly code = 'redis-claim-ledger' as const;

  constructor(
    readonly operation: 'claim' | 'complete',
    readonly ticket: string,
    readonly reply: unknown,
  ) {
    super(
      `redis claim ledger, ${operation} of ticket ${ticket}: the script answered ` +
        `${JSON.stringify(reply)}; deploy the library's lua/ files with its code`,
    );
  }
}
