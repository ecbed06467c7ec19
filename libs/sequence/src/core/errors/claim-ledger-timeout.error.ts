import { SequenceError } from './sequence.error';

/** The claim ledger call a delivery of a ticket gave up waiting on. */
export type ClaimLedgerCall = 'claim' | 'complete' | 'release';

/**
 * A claim ledger did not answer a call within its bound: `claim` and `release` within
 * `tuning.leaseMs` (any lease a lost claim took has lapsed by then), each `complete` within half
 * of it (the time its retries get). The call was abandoned; it may still land in the ledger. The
 * message is requeued as for a ledger outage, and dead-lettered `store-unavailable` once
 * requeued `tuning.maxStoreRequeues` times.
 */
export class ClaimLedgerTimeoutError extends SequenceError {
  readonly code = 'claim-ledger-timeout' as const;

  constructor(
    readonly ledger: string,
    readonly call: ClaimLedgerCall,
    readonly ticket: string,
    readonly group: string,
    readonly timeoutMs: number,
    /** The option the bound comes from, e.g. `tuning.leaseMs`. */
    readonly option: string,
  ) {
    super(
      `the ${ledger} claim ledger did not answer ${call} of ${JSON.stringify(ticket)} for ` +
        `${group} within ${timeoutMs} ms (${option}); the call was abandoned`,
    );
  }
}
