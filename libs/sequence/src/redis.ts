/**
 * `nest-sequence/redis`: every Redis adapter (peer: ioredis), and `redis()`, the preset that wires
 * the sequence store, the resequencer store, the claim ledger and the payload store over one
 * connection.
 *
 * @module nest-sequence/redis
 */
export {
  RedisSequenceStore,
  type RedisSequenceStoreOptions,
} from './adapters/stores/redis/redis.sequence-store';
export { RedisSequenceStoreError } from './adapters/stores/redis/redis-store.error';
export {
  RedisResequencerStore,
  type RedisResequencerStoreOptions,
} from './adapters/stores/redis/redis.resequencer-store';
export { RedisResequencerStoreError } from './adapters/stores/redis/redis-resequencer-store.error';
export {
  RedisClaimLedger,
  type RedisClaimLedgerOptions,
} from './adapters/stores/redis/redis.claim-ledger';
export { RedisClaimLedgerError } from './adapters/stores/redis/redis-claim-ledger.error';
export { RedisPayloadStore } from './adapters/payload/redis/redis.payload-store';
export type { RedisPayloadStoreOptions } from './adapters/payload/redis/redis-payload.options';
export { RedisPayloadStoreError } from './adapters/payload/redis/redis-payload-store.error';
export { redis, type RedisStoresOptions } from './adapters/presets/redis.preset';
