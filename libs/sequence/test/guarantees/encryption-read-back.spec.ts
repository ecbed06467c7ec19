import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { RedisSequenceStore } from 'nest-sequence/redis';
import type { AcceptContext, FragmentRecord } from 'nest-sequence/ports';
import { bodyKeyAt, RedisKeys } from '../../src/adapters/stores/redis/redis-keys';
import { describeWithServer } from '../support/servers';
import { useRedis } from '../support/redis.fixture';
import {
  createSequenceTestApp,
  deadLetters,
  makeFragments,
  publishAll,
  type SequenceTestApp,
} from '../support/sequence-test-app';

const KIB = 1024;
const KEY_A = { id: 'key-a', key: randomBytes(32) };

/*
 * docs/security.md: a body altered in Redis fails to decrypt, and for a sequence verified as it
 * arrived (published in order to one instance: no read-back pass) its handler's stream fails
 * before the altered body. A large body is read back in ranges of `readPieceBytes`, and GCM's
 * plaintext is unauthenticated until the tag (in the last range) checks: a flipped ciphertext
 * bit flips the same plaintext bit. No range of such a body may reach the handler before then.
 */
describeWithServer('redis', 'encryption at rest: a large body read back in ranges', () => {
  let t: SequenceTestApp | undefined;
  const servers = useRedis({
    stem: 'nseq-test:encryption-ranges',
    beforeCleanup: async () => {
      await t?.close();
      t = undefined;
    },
  });

  it('never hands the handler bytes of a body whose ciphertext was altered in Redis', async () => {
    const redis: Redis = servers.client;
    const prefix = servers.prefix;
    const channel = 'encryption.ranges';
    const store = new RedisSequenceStore(redis, {
      prefix,
      readPieceBytes: 64 * KIB,
      encryption: { keys: [KEY_A] },
    });
    // The attacker flips one ciphertext bit of position 1 (a key of its own: 200 KiB) the moment
    // the sequence completes; it lies in the body's first 64 KiB range.
    const FLIPPED_PLAINTEXT_OFFSET = 1_000;
    const accept = store.accept.bind(store);
    store.accept = async (fragment: FragmentRecord, context: AcceptContext) => {
      const result = await accept(fragment, context);
      if (result.status === 'complete') {
        const keys = new RedisKeys(prefix).sequence({ scope: channel, sequenceId: 'seq' });
        const large = bodyKeyAt(keys, 1);
        const stored = (await redis.getBuffer(large))!;
        stored[82 + FLIPPED_PLAINTEXT_OFFSET] ^= 0x01;
        await redis.set(large, stored, 'KEEPTTL');
      }
      return result;
    };
    t = await createSequenceTestApp(channel, { sequence: { store } });
    const payload = randomBytes(200 * KIB + 10 * KIB);
    const received: Buffer[] = [];
    let streamError: unknown;
    t.handler.onCall = async (reassembled) => {
      try {
        for await (const chunk of reassembled.stream()) received.push(chunk as Buffer);
      } catch (error) {
        streamError = error;
      }
    };

    // In order, to one instance: verified as it arrived, so the handler is called.
    await publishAll(t.transport, channel, makeFragments('seq', payload, 200 * KIB));
    await t.transport.whenIdle();

    // The sequence is dead-lettered (that part holds)...
    expect(streamError).toBeDefined();
    expect(deadLetters(t.transport, channel)).toHaveLength(1);
    // ...but the handler must not have been given altered bytes: what it read is a prefix of
    // the payload that stops before the altered byte.
    const got = Buffer.concat(received);
    expect(got.equals(payload.subarray(0, got.length))).toBe(true);
    expect(got.length).toBeLessThanOrEqual(FLIPPED_PLAINTEXT_OFFSET);
  });
});
