import { createHash } from 'node:crypto';
import type { ClaimKey } from '../../../ports/claim-ledger.port';

/** The keys of one (ticket, group) claim, in the order the claim scripts take them. */
export interface ClaimKeys {
  /** Hash group → retainUntil: the ticket's completed groups (shared by all its groups). */
  readonly done: string;
  /** Hash {holder, until}: this group's lease on the ticket. */
  readonly lease: string;
}

/**
 * Key names of a claim ledger under `prefix`:
 *
 *   <prefix>:{claim:<sha256 of ticket>}:done            hash  group -> retainUntil
 *   <prefix>:{claim:<sha256 of ticket>}:lease:<group>   hash  holder, until
 *
 * A ticket is untrusted text (it comes from a message), so only its SHA-256 (hex) goes into the
 * hash tag: whatever braces it holds, all keys of one ticket share one cluster slot, and the
 * `done` hash that counts its groups is in that slot too. The group follows the tag, where
 * braces no longer matter (Redis hashes only the first `{...}` of a name).
 */
export class RedisClaimKeys {
  constructor(readonly prefix: string) {
    if (/[{}]/.test(prefix)) {
      throw new Error(
        `Redis key prefix "${prefix}" contains { or }, which would break the hash tags that keep ` +
          'each ticket in one cluster slot; choose a prefix without braces',
      );
    }
  }

  /** The keys' common part, ending in the hash tag. */
  tagOf(ticket: string): string {
    const digest = createHash('sha256').update(ticket, 'utf8').digest('hex');
    return `${this.prefix}:{claim:${digest}}`;
  }

  of(key: ClaimKey): ClaimKeys {
    const tag = this.tagOf(key.ticket);
    return { done: `${tag}:done`, lease: `${tag}:lease:${key.group}` };
  }
}
