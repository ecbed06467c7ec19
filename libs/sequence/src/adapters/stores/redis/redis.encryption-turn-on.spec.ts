import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { RedisSequenceStore } from './redis.sequence-store';
import type { AcceptContext } from '../../../ports/sequence-store.port';
import { StoredFragmentDecryptionError } from '../../../core/errors/stored-fragment-decryption.error';
import { readAll, sequenceFixture } from '../../../testing/conformance/sequence-store.conformance';
import { describeWithServer } from '../../../../test/support/servers';
import { SERVERS } from '../../../../test/support/servers';
import { deleteUnder, newPrefix } from '../../../../test/support/redis.fixture';

/*
 * docs/security.md, "Turning it on": sequences stored before are plaintext and fail to decrypt
 * as `malformed-header`. That includes the user headers of a sequence without any ("{}", which an
 * encrypting store decodes to no bytes at all) and an empty body: not `truncated`, which would
 * send an operator looking for tampering instead of at the switch-over.
 */
const KEY = { id: 'k1', key: randomBytes(32) };

function context(now: number): AcceptContext {
  return {
    now,
    consumerId: 'c',
    leaseMs: 30_000,
    expiry: { ms: 60_000, strategy: 'fixed' },
    retentionMs: 60_000,
    limits: {
      maxSequenceBytes: 1e7,
      maxFragments: 10,
      maxBufferedBytes: 1e8,
      maxOpenSequences: 10,
    },
  };
}

describeWithServer(
  'redis',
  'RedisSequenceStore: turning encryption on with sequences stored',
  () => {
    let redis: Redis;
    let prefix: string;

    beforeAll(() => {
      redis = new Redis(SERVERS.redis.url);
    });
    afterAll(async () => {
      await redis.quit();
    });
    beforeEach(() => {
      prefix = newPrefix('nseq-test:turn-on');
    });
    afterEach(async () => {
      await deleteUnder(redis, prefix);
    });

    it('reports plaintext user headers "{}" stored before as malformed-header, as documented', async () => {
      const { fragments } = sequenceFixture('turn-on', ['first', 'second']);
      const before = new RedisSequenceStore(redis, { prefix });
      await before.accept(fragments[0], context(Date.now()));

      const after = new RedisSequenceStore(redis, { prefix, encryption: { keys: [KEY] } });
      const result = await after.accept(fragments[1], context(Date.now()));

      expect(result.status).toBe('complete');
      const failure = result.status === 'complete' ? result.sequence.integrityFailure : undefined;
      expect(failure).toBeDefined();
      expect(failure).toContain('(malformed-header)');
    });

    it('reports an empty plaintext body stored before as malformed-header, as documented', async () => {
      const { fragments, ref } = sequenceFixture('turn-on-body', ['', 'second'], {
        userHeaders: { a: 'b' },
      });
      const before = new RedisSequenceStore(redis, { prefix });
      await before.accept(fragments[0], context(Date.now()));
      const after = new RedisSequenceStore(redis, { prefix, encryption: { keys: [KEY] } });
      await after.accept(fragments[1], context(Date.now()));

      const error = await readAll(after.read(ref)).catch((caught: unknown) => caught);

      expect(error).toBeInstanceOf(StoredFragmentDecryptionError);
      expect(error).toMatchObject({ position: 1, reason: 'malformed-header' });
    });
  },
);
