import type { SequenceRef } from '../../../ports/sequence-store.port';

/** The keys of one sequence, in the order the per-sequence scripts take them. */
export interface SequenceKeys {
  readonly meta: string;
  readonly crc: string;
  readonly body: string;
  readonly done: string;
  readonly fence: string;
}

/** The store-wide keys, in the order the global scripts take them (all in slot `{idx}`). */
export interface GlobalKeys {
  readonly open: string;
  readonly due: string;
  readonly first: string;
  readonly retention: string;
  readonly retained: string;
  readonly totals: string;
}

/** Characters that would end the hash tag early (`{`, `}`), split the member (`:`), or escape (`%`). */
const SCOPE_ESCAPES = /[%{}:]/g;
const ESCAPED = /%(25|7B|7D|3A)/g;

/**
 * Key names of a store under `prefix`. One sequence's keys share the hash tag
 * `{seq:<encoded scope>:<sequence id>}` (`seq:` and its *member* name in the global index), so each
 * per-sequence script stays in one slot on Redis Cluster; the global keys share `{idx}`.
 * Sequence ids are `[A-Za-z0-9._:-]`; scopes (channel names) may hold anything, so `%`, `{`, `}`
 * and `:` are percent-encoded in them: the tag cannot end early, and the first `:` of a member
 * separates the scope from the id.
 */
export class RedisKeys {
  readonly global: GlobalKeys;

  constructor(readonly prefix: string) {
    if (/[{}]/.test(prefix)) {
      throw new Error(
        `Redis key prefix "${prefix}" contains { or }, which would break the hash tags that keep ` +
          'each sequence in one cluster slot; choose a prefix without braces',
      );
    }
    const tag = `${prefix}:{idx}`;
    this.global = {
      open: `${tag}:open`,
      due: `${tag}:due`,
      first: `${tag}:first`,
      retention: `${tag}:retention`,
      retained: `${tag}:retained`,
      totals: `${tag}:totals`,
    };
  }

  /** The sequence's name in the global index (its hash tag is `seq:` and this). */
  member(ref: SequenceRef): string {
    const scope = ref.scope.replace(
      SCOPE_ESCAPES,
      (char) => `%${char.charCodeAt(0).toString(16).toUpperCase()}`,
    );
    return `${scope}:${ref.sequenceId}`;
  }

  ref(member: string): SequenceRef {
    const split = member.indexOf(':');
    return {
      scope: member
        .slice(0, split)
        .replace(ESCAPED, (_match, hex: string) => String.fromCharCode(parseInt(hex, 16))),
      sequenceId: member.slice(split + 1),
    };
  }

  sequence(ref: SequenceRef): SequenceKeys {
    return this.sequenceOf(this.member(ref));
  }

  sequenceOf(member: string): SequenceKeys {
    // `seq:` first: a member is producer-chosen text (`<scope>:<id>`), and without a namespace of
    // its own it could spell the tag of another store under the same prefix (`{payload:<ref>}`,
    // `{claim:<digest>}`, `{rsq:…}`), whose keys a sequence would then overwrite or delete.
    const tag = `${this.prefix}:{seq:${member}}`;
    return {
      meta: `${tag}:meta`,
      crc: `${tag}:crc`,
      body: `${tag}:body`,
      done: `${tag}:done`,
      fence: `${tag}:fence`,
    };
  }
}

/** The string key of a body staged by the client and renamed into place (see accept-5.lua). */
export function bodyKeyAt(keys: SequenceKeys, position: number): string {
  return `${keys.body}:${position}`;
}

/** A key in the sequence's slot for one body on its way to accept (short TTL). */
export function stagedBodyKey(keys: SequenceKeys, id: string): string {
  return `${keys.body.slice(0, -':body'.length)}:staged:${id}`;
}

export function sequenceKeyList(keys: SequenceKeys): string[] {
  return [keys.meta, keys.crc, keys.body, keys.done, keys.fence];
}

export function globalKeyList(keys: GlobalKeys): string[] {
  return [keys.open, keys.due, keys.first, keys.retention, keys.retained, keys.totals];
}
