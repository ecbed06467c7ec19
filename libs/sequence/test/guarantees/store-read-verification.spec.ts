import { Readable } from 'node:stream';
import type { Redis } from 'ioredis';
import { RedisSequenceStore } from 'nest-sequence/redis';
import { SequenceIntegrityError, StoredFragmentIntegrityError } from 'nest-sequence';
import { type AcceptContext, type FragmentRecord } from 'nest-sequence/ports';
import { RedisKeys } from '../../src/adapters/stores/redis/redis-keys';
import * as checksum from '../../src/core/checksum';
import { forgedCopy } from '../support/crc32-forgery';
import { describeWithServer } from '../support/servers';
import { useRedis } from '../support/redis.fixture';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  deathReasonOf,
  eventually,
  makeFragments,
  publishAll,
  shuffled,
  type SequenceTestApp,
} from '../support/sequence-test-app';
import { InstrumentedStore } from './instrumented.sequence-store';

/**
 * Guarantees row "reassembled SHA-256 mismatch" with a store that checks what it reads (the Redis
 * store: `verifiesReads`). A sequence verified at intake is read once, for the handler, and each
 * body is checked against the CRC-32 it was stored with instead of hashing the payload again. A
 * body changed in Redis after intake still never reaches a handler as if it were good.
 */
describeWithServer('redis', 'guarantees: a store that verifies its reads (Redis)', () => {
  let t: SequenceTestApp | undefined;
  /** A second instance, when a test runs one. */
  let other: SequenceTestApp | undefined;
  const servers = useRedis({
    stem: 'nseq-test:read-verification',
    beforeCleanup: async () => {
      await t?.close();
      await other?.close();
      t = other = undefined;
    },
  });
  let redis: Redis;
  let prefix: string;

  beforeEach(() => {
    redis = servers.client;
    prefix = servers.prefix;
  });

  /** Flips the first byte of the body stored at `position` (kept inline: fragments are small). */
  async function alterStoredBody(channel: string, sequenceId: string, position: number) {
    const bodyKey = new RedisKeys(prefix).sequence({ scope: channel, sequenceId }).body;
    const stored = await redis.hgetBuffer(bodyKey, String(position));
    if (!stored) throw new Error(`no body stored at ${bodyKey} ${position}`);
    stored[0] ^= 0xff;
    await redis.hset(bodyKey, String(position), stored);
  }

  it.each([
    ['crc32', 1],
    ['sha256', 2],
  ] as const)(
    'reads a sequence stored in order once and hands it over byte-exact; readVerification %s hashes it %i time(s)',
    async (readVerification, hashes) => {
      const channel = `guarantees.read-verification.in-order-${readVerification}`;
      const store = new InstrumentedStore(
        new RedisSequenceStore(redis, { prefix, readVerification }),
      );
      t = await createSequenceTestApp(channel, {
        sequence: { store },
      });
      const payload = bytes(10_000, 71);
      // The fragments are made (and hashed) by the test before the count starts.
      const fragments = makeFragments('in-order', payload, 1_000);
      const hashers = jest.spyOn(checksum, 'sha256Hasher');
      try {
        await publishAll(t.transport, channel, fragments);
        await t.transport.whenIdle();
        // Once at intake; again while the handler reads only when the store does not vouch.
        expect(hashers).toHaveBeenCalledTimes(hashes);
      } finally {
        hashers.mockRestore();
      }

      expect(store.verifiesReads).toBe(readVerification === 'crc32');
      expect(store.reads).toBe(1);
      expect(t.handler.of('in-order')[0].bytes.equals(payload)).toBe(true);
    },
  );

  it('still counts the bytes: a verifying store whose read ends short fails the handler stream and dead-letters the sequence', async () => {
    const channel = 'guarantees.read-verification.short';
    const redisStore = new RedisSequenceStore(redis, { prefix });
    // A store that vouches for its reads yet ends one early (a bug, say): the last body is lost.
    const read = redisStore.read.bind(redisStore);
    redisStore.read = (ref) => {
      const source = read(ref);
      let chunks = 0;
      return Readable.from(
        (async function* () {
          for await (const chunk of source) {
            if (++chunks === 4) return;
            yield chunk as Buffer;
          }
        })(),
      );
    };
    t = await createSequenceTestApp(channel, {
      sequence: { store: redisStore },
    });
    let streamError: unknown;
    t.handler.onCall = async (delivered) => {
      await delivered.toBuffer().catch((error: unknown) => {
        streamError = error;
        throw error;
      });
    };

    await publishAll(t.transport, channel, makeFragments('short', bytes(4_000, 74), 1_000));
    await t.transport.whenIdle();

    expect(streamError).toBeInstanceOf(SequenceIntegrityError);
    expect(t.handler.deliveries).toHaveLength(0);
    const dead = deadLetters(t.transport, channel);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(
      /^integrity-mismatch: sequence short: reassembled 3000 bytes/,
    );
  });

  it('fails the handler stream and dead-letters the sequence when a body changed in Redis after intake', async () => {
    const channel = 'guarantees.read-verification.altered';
    t = await createSequenceTestApp(channel, {
      handlerRetry: { attempts: 3, baseDelayMs: 1 },
      sequence: { store: new RedisSequenceStore(redis, { prefix }) },
    });
    let streamError: unknown;
    let readBytes = 0;
    t.handler.onCall = async (delivered) => {
      await alterStoredBody(channel, 'altered', 3);
      try {
        for await (const chunk of delivered.stream()) readBytes += (chunk as Buffer).length;
      } catch (error) {
        streamError = error;
        throw error;
      }
    };

    await publishAll(t.transport, channel, makeFragments('altered', bytes(5_000, 72), 1_000));
    await t.transport.whenIdle();

    expect(streamError).toBeInstanceOf(StoredFragmentIntegrityError);
    expect(streamError).toMatchObject({ sequenceId: 'altered', position: 3 });
    // The altered body itself was never handed over: the stream failed before pushing it.
    expect(readBytes).toBe(2_000);
    expect(t.handler.calls).toBe(1);
    expect(t.handler.deliveries).toHaveLength(0);
    const dead = deadLetters(t.transport, channel);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(
      /^integrity-mismatch: sequence altered: the body at position 3 read back from the store/,
    );
  });

  it('dead-letters, without calling the handler, a sequence whose body changed before its verification read', async () => {
    const channel = 'guarantees.read-verification.before-check';
    const redisStore = new RedisSequenceStore(redis, { prefix });
    // Stored out of order, so the sequence is read back and hashed before the handler; a body
    // changes in Redis the moment the sequence completes.
    const accept = redisStore.accept.bind(redisStore);
    redisStore.accept = async (fragment: FragmentRecord, context: AcceptContext) => {
      const result = await accept(fragment, context);
      if (result.status === 'complete') {
        await alterStoredBody(channel, fragment.sequenceId, 2);
      }
      return result;
    };
    t = await createSequenceTestApp(channel, {
      sequence: { store: redisStore },
    });
    const fragments = shuffled(makeFragments('before-check', bytes(4_000, 73), 1_000), 5);

    await publishAll(t.transport, channel, fragments);
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(0);
    const dead = deadLetters(t.transport, channel);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(
      /^integrity-mismatch: sequence before-check: the body at position 2 read back/,
    );
  });

  // Regression: a copy taking over a complete sequence stores nothing; hashing it as if it had
  // would vouch for the body another instance stored there, which the CRC-32 reads check cannot
  // tell from the genuine one when it was forged to the same CRC-32.
  it('dead-letters, without calling the handler, a sequence whose last body another instance stored forged, when a genuine copy takes it over', async () => {
    const channel = 'guarantees.read-verification.takeover-forged';
    t = await createSequenceTestApp(channel, {
      sequence: { store: new RedisSequenceStore(redis, { prefix }) },
    });
    // Another instance, on a broker of its own: its verifying read fails, so it gives the lease
    // back and its message waits a minute to come back.
    const handingBack = new InstrumentedStore(new RedisSequenceStore(redis, { prefix }));
    other = await createSequenceTestApp(channel, {
      sequence: { store: handingBack },
      tuning: { backpressureDelayMs: 60_000 },
    });
    const fragments = makeFragments('takeover-forged', bytes(4_000, 75), 1_000);
    const forged = forgedCopy(fragments[3]);
    expect(forged.body.equals(fragments[3].body)).toBe(false);

    await publishAll(t.transport, channel, fragments.slice(0, 3));
    await t.transport.whenIdle();
    handingBack.failNextReads = 1;
    await publishAll(other.transport, channel, [forged]);
    await eventually(
      () => handingBack.failNextReads === 0 && other?.transport.delayed(channel) === 1,
      'the other instance to hand the completed sequence back',
    );
    // The genuine last fragment reaches the first instance, which stored 1 to 3 in order: a copy
    // of what is stored at 4 (the same CRC-32), it takes the sequence over.
    await publishAll(t.transport, channel, [fragments[3]]);
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(0);
    const dead = deadLetters(t.transport, channel);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(
      /^integrity-mismatch: sequence takeover-forged: .*sha256/,
    );
  });
});
