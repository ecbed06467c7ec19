import type { ResequencerKey } from '../../../ports/resequencer-store.port';

/** The keys of one resequencer key, in the order the per-key scripts take them. */
export interface ResequencerKeyKeys {
  /** Hash: next, ver, at, gapSince, alerted, handOffAt, holder, until. */
  readonly state: string;
  /** Sorted set: score = sequence, member = the encoded entry. */
  readonly buffer: string;
  /** List of encoded hand-off items, head first. */
  readonly handOff: string;
}

/** The keys of one scope's index, in the order the index scripts take them (one slot). */
export interface ResequencerIndexKeys {
  /**
   * Hash: key -> index record "ver:buffered:next:lowest:bytes"; the empty field (no key has an
   * empty name) -> bytes buffered in the scope (the sum of the records' bytes).
   */
  readonly records: string;
  /**
   * Sorted set: key -> gapSince for every key with an open gap not alerted yet, and
   * gapSince + 2^50 for one whose gap was alerted and still waits (never due again).
   */
  readonly gaps: string;
  /** Sorted set: key -> handOffAt, for keys whose hand-off list is not empty. */
  readonly stalled: string;
  /** Sorted set: key -> time of its last indexed write: what retention prunes by. */
  readonly activity: string;
  /** String: events buffered in the scope (the sum of the records' `buffered`). */
  readonly total: string;
}

/** `%` (the escape), `{` and `}` (which would end the hash tag early), `:` (the separator). */
const ESCAPES = /[%{}:]/g;

function encode(part: string): string {
  return part.replace(ESCAPES, (char) => `%${char.charCodeAt(0).toString(16).toUpperCase()}`);
}

/**
 * Key names of a resequencer store under `prefix`:
 *
 *   <prefix>:{rsq:<scope>:<key>}:state        hash   the key's state
 *   <prefix>:{rsq:<scope>:<key>}:buffer       zset   seq -> encoded entry
 *   <prefix>:{rsq:<scope>:<key>}:handoff      list   encoded hand-off items
 *   <prefix>:{rsq-idx:<scope>}:records        hash   key -> "ver:buffered:next:lowest:bytes"
 *   <prefix>:{rsq-idx:<scope>}:gaps           zset   key -> gapSince (open; alerted: gapSince + 2^50)
 *   <prefix>:{rsq-idx:<scope>}:stalled        zset   key -> handOffAt (hand-off not empty)
 *   <prefix>:{rsq-idx:<scope>}:activity       zset   key -> last indexed write
 *   <prefix>:{rsq-idx:<scope>}:total          string events buffered in the scope
 *
 * `%`, `{`, `}` and `:` are percent-encoded in scope and key, so a tag can neither end early
 * nor be read two ways: each key's three keys share one cluster slot, each scope's index
 * another. The index names a key by its raw text (sorted-set members may hold anything).
 */
export class RedisResequencerKeys {
  constructor(readonly prefix: string) {
    if (/[{}]/.test(prefix)) {
      throw new Error(
        `Redis key prefix "${prefix}" contains { or }, which would break the hash tags that keep ` +
          'each resequencer key in one cluster slot; choose a prefix without braces',
      );
    }
  }

  /** The common part of a key's keys, ending in its hash tag. */
  tagOf(key: ResequencerKey): string {
    return `${this.prefix}:{rsq:${encode(key.scope)}:${encode(key.key)}}`;
  }

  of(key: ResequencerKey): ResequencerKeyKeys {
    const tag = this.tagOf(key);
    return { state: `${tag}:state`, buffer: `${tag}:buffer`, handOff: `${tag}:handoff` };
  }

  index(scope: string): ResequencerIndexKeys {
    const tag = `${this.prefix}:{rsq-idx:${encode(scope)}}`;
    return {
      records: `${tag}:records`,
      gaps: `${tag}:gaps`,
      stalled: `${tag}:stalled`,
      activity: `${tag}:activity`,
      total: `${tag}:total`,
    };
  }
}

export function keyKeyList(keys: ResequencerKeyKeys): string[] {
  return [keys.state, keys.buffer, keys.handOff];
}

export function indexKeyList(keys: ResequencerIndexKeys): string[] {
  return [keys.records, keys.gaps, keys.stalled, keys.activity, keys.total];
}
