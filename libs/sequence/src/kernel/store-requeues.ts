import { requeueCount } from '../ports/transport.port';

/** The reason of a requeue for a payload store that could not be read or written. */
export const PAYLOAD_STORE_UNAVAILABLE = 'payload store unavailable';
/** The reason of a requeue for a claim ledger that failed. */
export const CLAIM_LEDGER_UNAVAILABLE = 'claim ledger unavailable';

/**
 * A payload store, claim ledger or inbox table failure requeues its message, but not for ever:
 * an error that is not an outage (corrupt metadata, a permission refused, a store that never
 * answers) would otherwise bring it back until its ticket expires, or for ever. Once the
 * message has been requeued `tuning.maxStoreRequeues` times (its `x-requeue-count`, which counts
 * every delayed requeue, a busy lease's included), the failure dead-letters it
 * `store-unavailable` with the detail this returns. Undefined while it may still be requeued.
 * @param failed what failed, the requeue's reason ({@link PAYLOAD_STORE_UNAVAILABLE}, ...)
 * @param cause the last failure, told at the end of the detail
 */
export function storeRequeuesSpent(
  headers: Readonly<Record<string, unknown>>,
  failed: string,
  cause: string | undefined,
  maxStoreRequeues: number,
): string | undefined {
  const requeues = requeueCount(headers);
  if (requeues < maxStoreRequeues) return undefined;
  return (
    `${failed} after ${requeues} requeues of the message ` +
    `(tuning.maxStoreRequeues is ${maxStoreRequeues})` +
    (cause === undefined ? '' : `, last: ${cause}`) +
    '; publish the message again from the dead-letter channel once the store answers'
  );
}
