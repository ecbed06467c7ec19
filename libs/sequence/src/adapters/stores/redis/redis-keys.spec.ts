import { createHash, randomUUID } from 'node:crypto';
import { RedisPayloadKeys } from '../../payload/redis/redis-payload-keys';
import { RedisClaimKeys } from './redis-claim-keys';
import { RedisKeys } from './redis-keys';
import { RedisResequencerKeys } from './redis-resequencer-keys';

/** The hash tag of a key: what Redis Cluster hashes, and what keeps each store's keys apart. */
function tagOf(key: string): string {
  return /\{([^}]*)\}/.exec(key)![1];
}

/**
 * The stores of the `redis()` preset share one prefix. A sequence's tag is made of text a
 * producer chooses (the channel and `x-sequence-id`, which may hold `:`): it must never spell the
 * tag of another store's keys, or a sequence would overwrite or delete them (a parked payload's
 * meta, a claim ledger's completions: handled twice).
 */
describe('RedisKeys: the sequence store keeps to a namespace of its own', () => {
  const prefix = 'nseq';
  const sequences = new RedisKeys(prefix);

  const ticket = 'filesystem:2f1c';
  it.each([
    // The ref of a parked payload is public (in its ticket), and a UUID is a valid sequence id.
    ['a parked payload', 'payload', randomUUID()],
    // The ledger's tag is the ticket's SHA-256: 64 hex characters, a valid sequence id too.
    ['a claim ledger entry', 'claim', createHash('sha256').update(ticket).digest('hex')],
    ['a resequencer key', 'rsq', 'orders:o-1'],
    ['a resequencer index', 'rsq-idx', 'orders'],
  ])('never spells the tag of %s', (what, scope, sequenceId) => {
    const others: Record<string, string> = {
      'a parked payload': new RedisPayloadKeys(prefix).payload(sequenceId).meta,
      'a claim ledger entry': new RedisClaimKeys(prefix).of({ ticket, group: 'g' }).done,
      'a resequencer key': new RedisResequencerKeys(prefix).of({ scope: 'orders', key: 'o-1' })
        .state,
      'a resequencer index': new RedisResequencerKeys(prefix).index('orders').records,
    };
    const own = sequences.sequence({ scope, sequenceId });
    expect(tagOf(own.meta)).not.toBe(tagOf(others[what]));
  });

  it('keeps one tag for every key of a sequence', () => {
    const keys = sequences.sequence({ scope: 'orders', sequenceId: 's:1' });
    expect(new Set([keys.meta, keys.crc, keys.body, keys.done, keys.fence].map(tagOf))).toEqual(
      new Set(['seq:orders:s:1']),
    );
  });
});
