/**
 * The one thing the redis-read-memory probe takes from the library's internals: RedisDirectReads,
 * the store's reads on a connection of their own (what `unsafeSocketTricks` turns on), measured
 * here without a store around it. No public entry point exports it.
 */
export { RedisDirectReads } from '../../libs/sequence/src/adapters/stores/redis/redis-direct-reads';
