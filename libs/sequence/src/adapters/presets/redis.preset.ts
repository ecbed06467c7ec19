import type { Cluster, Redis, RedisOptions } from 'ioredis';
import type { StoreEncryptionOptions } from '../../core/body-cipher';
import type { StoreSet } from '../../ports/store-set.port';
import { RedisPayloadStore } from '../payload/redis/redis.payload-store';
import type { RedisPayloadStoreOptions } from '../payload/redis/redis-payload.options';
import { RedisClaimLedger, type RedisClaimLedgerOptions } from '../stores/redis/redis.claim-ledger';
import { newRedisClient, quitRedisClient } from '../stores/redis/redis-client';
import { refuseUnknownKeys, type OptionKeysOf } from '../../core/option-keys';
import { SequenceOptionsError } from '../../core/errors/sequence-options.error';
import {
  RedisResequencerStore,
  type RedisResequencerStoreOptions,
} from '../stores/redis/redis.resequencer-store';
import {
  RedisSequenceStore,
  type RedisSequenceStoreOptions,
} from '../stores/redis/redis.sequence-store';

/** Options of {@link redis}: what the four stores share, and each one's own. */
export interface RedisStoresOptions {
  /** Prefix of every key the stores write (instances that share state share it). @default 'nseq' */
  readonly prefix?: string;
  /** Settings of the client the preset creates from a URL (ignored when given a client). */
  readonly redis?: RedisOptions;
  /** See each store's option: off by default, for every store of the set. @default false */
  readonly unsafeSocketTricks?: boolean;
  /**
   * AES-256-GCM encryption at rest of the sequence store's bodies and user headers and the
   * resequencer store's events (see docs/security.md); Claim Check's payloads are encrypted by
   * `claimCheck.encryption`.
   * @default none
   */
  readonly encryption?: StoreEncryptionOptions;
  readonly sequenceStore?: Omit<
    RedisSequenceStoreOptions,
    'prefix' | 'unsafeSocketTricks' | 'encryption'
  >;
  readonly resequencerStore?: Omit<
    RedisResequencerStoreOptions,
    'prefix' | 'unsafeSocketTricks' | 'encryption'
  >;
  readonly claimLedger?: Omit<RedisClaimLedgerOptions, 'prefix' | 'unsafeSocketTricks'>;
  /**
   * The Redis payload store's options, or `false` to leave Claim Check's payloads to another
   * store (a filesystem shared by the instances, or S3: large payloads are memory in Redis).
   */
  readonly payloadStore?: Omit<RedisPayloadStoreOptions, 'prefix' | 'unsafeSocketTricks'> | false;
}

const REDIS_STORES_KEYS = {
  prefix: true,
  redis: true,
  unsafeSocketTricks: true,
  encryption: true,
  sequenceStore: true,
  resequencerStore: true,
  claimLedger: true,
  payloadStore: true,
} as const satisfies OptionKeysOf<RedisStoresOptions>;

/**
 * What the preset sets for every store, by group: a store's group (past the types, from a
 * `forRootAsync` factory or plain JavaScript) that names one too would have it overwritten,
 * encryption with nothing.
 */
const SET_FOR_EVERY_STORE = {
  sequenceStore: ['prefix', 'unsafeSocketTricks', 'encryption'],
  resequencerStore: ['prefix', 'unsafeSocketTricks', 'encryption'],
  claimLedger: ['prefix', 'unsafeSocketTricks'],
  payloadStore: ['prefix', 'unsafeSocketTricks'],
} as const;

function refuseSharedInGroups(options: RedisStoresOptions): void {
  const problems: string[] = [];
  for (const [group, keys] of Object.entries(SET_FOR_EVERY_STORE)) {
    const given: unknown = options[group as keyof typeof SET_FOR_EVERY_STORE];
    if (typeof given !== 'object' || given === null) continue;
    for (const key of keys) {
      if (key in given) {
        problems.push(`${group}.${key}: give it to redis() itself, which sets it for every store`);
      }
    }
  }
  if (problems.length > 0) throw new SequenceOptionsError('redis() options', problems);
}

/**
 * Every Redis store of the module over one connection: the sequence store, the resequencer store,
 * the claim ledger and the payload store, for `SequenceModule.forRoot({ stores })`. Given a URL,
 * the preset opens the client and the module closes it at shutdown; given a client (a `Redis`
 * or a `Cluster`), it is yours to close after the application.
 *
 * @example
 * SequenceModule.forRoot({ transport, stores: redis(process.env.REDIS_URL, { prefix: 'imaging' }) })
 */
export function redis(
  urlOrClient: string | Redis | Cluster,
  options: RedisStoresOptions = {},
): StoreSet {
  // The stores check the options given to each of them: these are the groups and shared ones.
  refuseUnknownKeys('redis() options', options, REDIS_STORES_KEYS);
  refuseSharedInGroups(options);
  const ownsClient = typeof urlOrClient === 'string';
  const client = ownsClient ? newRedisClient(urlOrClient, options.redis) : urlOrClient;
  const shared = { prefix: options.prefix, unsafeSocketTricks: options.unsafeSocketTricks };
  let stores;
  try {
    stores = {
      sequenceStore: new RedisSequenceStore(client, {
        ...options.sequenceStore,
        ...shared,
        encryption: options.encryption,
      }),
      resequencerStore: new RedisResequencerStore(client, {
        ...options.resequencerStore,
        ...shared,
        encryption: options.encryption,
      }),
      claimLedger: new RedisClaimLedger(client, { ...options.claimLedger, ...shared }),
      payloadStore:
        options.payloadStore === false
          ? undefined
          : new RedisPayloadStore(client, { ...options.payloadStore, ...shared }),
    };
  } catch (error) {
    // A store refused its options: the connection opened for them must not stay open.
    if (ownsClient) client.disconnect();
    throw error;
  }
  const { sequenceStore, resequencerStore, claimLedger, payloadStore } = stores;
  return {
    name: 'redis',
    sequenceStore,
    resequencerStore,
    claimLedger,
    payloadStore,
    async close() {
      // The stores do not own the shared client: each closes what is its own (a reads connection).
      await Promise.all([
        sequenceStore.close(),
        resequencerStore.close(),
        claimLedger.close(),
        payloadStore?.close(),
      ]);
      if (ownsClient) await quitRedisClient(client);
    },
  };
}
