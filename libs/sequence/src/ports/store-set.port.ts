import type { ClaimLedger } from './claim-ledger.port';
import type { OutboxStore } from './outbox-store.port';
import type { PayloadStore } from './payload-store.port';
import type { ResequencerStore } from './resequencer-store.port';
import type { SequenceStore } from './sequence-store.port';

/**
 * Stores of one backend over one shared connection, as a preset makes them (`redis()` of
 * `nest-sequence/redis`, `postgres()` of `nest-sequence/postgres`), for the module's `stores`
 * option. A set holds the stores its backend offers; the module takes each pattern's store from
 * the first set that has one, unless that pattern's own `store` option names another.
 *
 * Contract: `close()` closes every store of the set and the connection the preset opened (not
 * one the caller handed in); the module calls it once, at shutdown.
 */
export interface StoreSet {
  /** The backend, for messages (`'redis'`, `'postgres'`). */
  readonly name: string;
  readonly sequenceStore?: SequenceStore;
  readonly resequencerStore?: ResequencerStore;
  readonly claimLedger?: ClaimLedger;
  readonly payloadStore?: PayloadStore;
  readonly outboxStore?: OutboxStore;
  close(): Promise<void>;
}
