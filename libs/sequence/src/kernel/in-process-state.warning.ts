import type { ClaimLedger } from '../ports/claim-ledger.port';
import type { ResequencerStore } from '../ports/resequencer-store.port';
import type { SequenceStore } from '../ports/sequence-store.port';
import type { ChannelBinding, InProcessState } from './channel-binding';

/**
 * The startup warning for a broker that keeps messages (anything but the in-memory transport)
 * with handlers that ack into a store keeping its state in this process only: what is acked once
 * stored is lost with the process, and several instances each hold a part. Fine for a try-out;
 * undefined when there is nothing to say.
 */
export function inProcessStateWarning(
  transportName: string,
  bindings: readonly ChannelBinding[],
): string | undefined {
  if (transportName === 'in-memory') return undefined;
  const risks = new Map<string, string>();
  for (const state of bindings.flatMap(({ inProcessState }) => inProcessState ?? [])) {
    if (state.storeName !== 'memory') continue;
    risks.set(state.what, `${state.what} (${state.fix})`);
  }
  if (risks.size === 0) return undefined;
  return (
    `${transportName} acks what this process keeps in memory only: ${[...risks.values()].join('; ')}. ` +
    'A crash loses what was acked and not yet delivered, and several instances each hold a ' +
    'part: use a shared store in production'
  );
}

/** What a consumer that reassembles into the sequence store keeps there. */
export function sequenceStoreState(store: SequenceStore): InProcessState {
  return {
    what: 'sequence fragments',
    storeName: store.name,
    fix:
      "the module's store defaults to MemorySequenceStore; set `sequence.store`, or `stores`, " +
      'e.g. redis(url) of nest-sequence/redis',
  };
}

/** What a consumer that orders events in the resequencer store keeps there. */
export function resequencerStoreState(store: ResequencerStore): InProcessState {
  return {
    what: 'resequenced and streamed events',
    storeName: store.name,
    fix:
      '`resequencer.store` defaults to MemoryResequencerStore; set it, or `stores`, e.g. ' +
      'redis(url) of nest-sequence/redis',
  };
}

/** What a Claim Check consumer records in the claim ledger: which tickets were handled. */
export function claimLedgerState(ledger: ClaimLedger): InProcessState {
  return {
    what: 'claim-check claims',
    storeName: ledger.name,
    fix:
      '`claimCheck.ledger` defaults to MemoryClaimLedger, so a ticket redelivered to another ' +
      'instance runs its handler again; set it, or `stores`, e.g. redis(url) of nest-sequence/redis',
  };
}
