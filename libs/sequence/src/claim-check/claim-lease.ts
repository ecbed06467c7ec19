import type { Logger } from '@nestjs/common';
import { ClaimLeaseLostError } from '../core/errors/claim-lease-lost.error';
import { ClaimLedgerTimeoutError } from '../core/errors/claim-ledger-timeout.error';
import type { LeaseInstant } from '../core/lease-clock';
import { KeptLease, type LeaseLoss } from '../kernel/kept-lease';
import type { ClaimKey, ClaimLedger } from '../ports/claim-ledger.port';

/**
 * A ticket's claim as its holder keeps it while the ticket's handler runs (as the Resequencer's
 * DrainLease does a key's): see {@link KeptLease}. Once it may pass to another holder, `signal`
 * aborts with a {@link ClaimLeaseLostError}.
 */
export function claimLease(
  ledger: ClaimLedger,
  key: ClaimKey,
  holder: string,
  leaseMs: number,
  /** When the claim that granted the lease was sent (the lease runs from then). */
  claimedAt: LeaseInstant,
  logger: Logger,
): KeptLease {
  const terms = {
    name: `the claim on ${key.ticket}`,
    renew: async () => (await ledger.claim(key, holder, leaseMs, Date.now())) === 'claimed',
    renewalTimeout: (ms: number) =>
      new ClaimLedgerTimeoutError(
        ledger.name,
        'claim',
        key.ticket,
        key.group,
        ms,
        'a third of tuning.leaseMs, renewing',
      ),
    lost: (why: LeaseLoss) =>
      new ClaimLeaseLostError(ledger.name, key.ticket, key.group, why, leaseMs),
  };
  return new KeptLease(terms, leaseMs, claimedAt, logger);
}
