/**
 * The refs this store generates: lowercase random (version 4) UUIDs, as `randomUUID()` makes
 * them. Anything else is refused before a key is built from it: a ref comes from a message, and
 * `{`, `}` (hash tag), `:` (key structure), `*` (patterns), spaces or newlines must never reach
 * a key name.
 */
const REF = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

export function isStoreRef(ref: unknown): ref is string {
  return typeof ref === 'string' && REF.test(ref);
}

/** Fields of a payload's meta hash. */
export type MetaField =
  | 'state'
  | 'bytes'
  | 'chunks'
  | 'createdAt'
  | 'expiresAt'
  | 'published'
  | 'contentType'
  | 'metadata';

/** The keys of one payload; all share the hash tag `{payload:<ref>}`, hence one cluster slot. */
export interface PayloadKeys {
  /** Hash: state, bytes, chunks, createdAt, expiresAt, published, contentType, metadata. */
  readonly meta: string;
  /** Chunk `index` (0-based) as a string key. */
  chunk(index: number): string;
}

/** The store-wide sweeping indexes (sorted sets of refs), all in the slot `{payload-idx}`. */
export interface PayloadIndexKeys {
  /** Every committed payload, scored by `expiresAt`. */
  readonly expiry: string;
  /** Committed payloads whose ticket was not yet published, scored by `createdAt`. */
  readonly unpublished: string;
}

/**
 * Key names under `prefix` (already checked to hold no brace):
 *   <prefix>:{payload:<ref>}:meta         hash
 *   <prefix>:{payload:<ref>}:chunk:<n>    string, n from 0
 *   <prefix>:{payload-idx}:expiry         zset ref -> expiresAt
 *   <prefix>:{payload-idx}:unpublished    zset ref -> createdAt
 * Callers must pass only refs for which {@link isStoreRef} holds.
 */
export class RedisPayloadKeys {
  readonly index: PayloadIndexKeys;

  constructor(readonly prefix: string) {
    this.index = {
      expiry: `${prefix}:{payload-idx}:expiry`,
      unpublished: `${prefix}:{payload-idx}:unpublished`,
    };
  }

  payload(ref: string): PayloadKeys {
    const tag = `${this.prefix}:{payload:${ref}}`;
    return {
      meta: `${tag}:meta`,
      chunk: (index) => `${tag}:chunk:${index}`,
    };
  }
}
