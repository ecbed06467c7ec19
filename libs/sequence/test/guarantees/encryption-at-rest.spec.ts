import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { RedisSequenceStore } from 'nest-sequence/redis';
import type { AcceptContext, FragmentRecord } from 'nest-sequence/ports';
import {
  bodyKeyAt,
  RedisKeys,
  type SequenceKeys,
} from '../../src/adapters/stores/redis/redis-keys';
import { readAll, sequenceFixture } from '../../src/testing/conformance/sequence-store.conformance';
import { describeWithServer } from '../support/servers';
import { useRedis } from '../support/redis.fixture';
import { valuesContaining } from '../support/redis-raw-values';
import {
  createSequenceTestApp,
  deadLetters,
  deathReasonOf,
  makeFragments,
  publishAll,
  shuffled,
  type SequenceTestApp,
} from '../support/sequence-test-app';

const KIB = 1024;
const KEY_A = { id: 'key-a', key: randomBytes(32) };
const KEY_B = { id: 'key-b', key: randomBytes(32) };
/** Fragments over 64 KiB are stored in keys of their own; the last one here stays inline. */
const FRAGMENT_BYTES = 100 * KIB;

/**
 * `sequence.store` with `encryption`: Redis holds no plaintext of a payload or of its user
 * headers; a body altered in Redis is dead-lettered as an integrity failure, never delivered;
 * sequences stored under a retired key still complete after a rotation.
 */
describeWithServer('redis', 'guarantees: encryption at rest (Redis sequence store)', () => {
  let t: SequenceTestApp | undefined;
  const servers = useRedis({
    stem: 'nseq-test:encryption',
    beforeCleanup: async () => {
      await t?.close();
      t = undefined;
    },
  });
  let redis: Redis;
  let prefix: string;
  /** 64 random bytes placed in every fragment of the payload. */
  let sample: Buffer;

  beforeEach(() => {
    redis = servers.client;
    prefix = servers.prefix;
    sample = randomBytes(64);
  });

  /** Four large fragments and a small last one, each holding the sample. */
  function payloadWithSample(): Buffer {
    const payload = randomBytes(4 * FRAGMENT_BYTES + 10 * KIB);
    for (let start = 0; start < payload.length; start += FRAGMENT_BYTES) {
      sample.copy(payload, start + 1_000);
    }
    return payload;
  }

  function keysOf(channel: string, sequenceId: string): SequenceKeys {
    return new RedisKeys(prefix).sequence({ scope: channel, sequenceId });
  }

  /** The stored body at `position`: in a key of its own when large, else in the body hash. */
  async function storedBody(keys: SequenceKeys, position: number): Promise<Buffer> {
    const stored =
      (await redis.getBuffer(bodyKeyAt(keys, position))) ??
      (await redis.hgetBuffer(keys.body, String(position)));
    if (!stored) throw new Error(`no body stored at position ${position}`);
    return stored;
  }

  it.each([
    ['holds none of', { encryption: { keys: [KEY_A] } }, 0],
    // The same scan finds it without encryption: the test can see plaintext when it is there.
    ['holds the sample in every fragment, without encryption,', {}, 5],
  ] as const)(
    'Redis %s the payload and its user headers while the sequence waits for its handler',
    async (_label, options, expected) => {
      const channel = 'guarantees.encryption.scan';
      const store = new RedisSequenceStore(redis, { prefix, ...options });
      t = await createSequenceTestApp(channel, { sequence: { store } });
      const payload = payloadWithSample();
      const headerText = sample.toString('hex');
      const found = { bodies: -1, headers: -1 };
      t.handler.onCall = async () => {
        found.bodies = await valuesContaining(redis, prefix, sample);
        found.headers = await valuesContaining(redis, prefix, headerText);
      };

      await publishAll(
        t.transport,
        channel,
        makeFragments('scan', payload, FRAGMENT_BYTES, { 'x-patient': headerText }),
      );
      await t.transport.whenIdle();

      expect(found).toEqual({ bodies: expected, headers: expected === 0 ? 0 : 1 });
      const [delivery] = t.handler.of('scan');
      expect(delivery.bytes.equals(payload)).toBe(true);
      expect(delivery.payload.headers).toEqual({ 'x-patient': headerText });
    },
  );

  it.each([
    ['a large body (a key of its own)', 2],
    ['a small body (inline in the body hash)', 5],
  ])(
    'dead-letters, never calling the handler, a sequence whose stored ciphertext of %s changed',
    async (_label, position) => {
      const channel = 'guarantees.encryption.tampered';
      const store = new RedisSequenceStore(redis, { prefix, encryption: { keys: [KEY_A] } });
      // Stored out of order, so the sequence is read back before its handler; one stored byte
      // flips the moment the sequence completes.
      const accept = store.accept.bind(store);
      store.accept = async (fragment: FragmentRecord, context: AcceptContext) => {
        const result = await accept(fragment, context);
        if (result.status === 'complete') await flipStoredByte('tampered', position);
        return result;
      };
      t = await createSequenceTestApp(channel, { sequence: { store } });

      await publishAll(
        t.transport,
        channel,
        shuffled(makeFragments('tampered', payloadWithSample(), FRAGMENT_BYTES), 3),
      );
      await t.transport.whenIdle();

      expect(t.handler.calls).toBe(0);
      const dead = deadLetters(t.transport, channel);
      expect(dead).toHaveLength(1);
      expect(deathReasonOf(dead[0])).toMatch(
        new RegExp(
          `^integrity-mismatch: sequence tampered: the body at position ${position} read back ` +
            'from the store did not decrypt \\(authentication-failed, key id "key-a"\\)',
        ),
      );

      async function flipStoredByte(sequenceId: string, at: number): Promise<void> {
        const keys = keysOf(channel, sequenceId);
        const stored = await storedBody(keys, at);
        stored[200] ^= 0x01;
        const large = bodyKeyAt(keys, at);
        if ((await redis.exists(large)) === 1) await redis.set(large, stored, 'KEEPTTL');
        else await redis.hset(keys.body, String(at), stored);
      }
    },
  );

  it('dead-letters, never calling the handler, a sequence whose stored user headers changed', async () => {
    const channel = 'guarantees.encryption.headers';
    const store = new RedisSequenceStore(redis, { prefix, encryption: { keys: [KEY_A] } });
    t = await createSequenceTestApp(channel, { sequence: { store } });
    const fragments = makeFragments('headers', payloadWithSample(), FRAGMENT_BYTES, {
      'x-patient': 'Jane Doe',
    });

    await publishAll(t.transport, channel, fragments.slice(0, -1));
    await t.transport.whenIdle();
    const { meta } = keysOf(channel, 'headers');
    const sealed = Buffer.from((await redis.hget(meta, 'userHeaders')) ?? '', 'base64');
    sealed[sealed.length - 1] ^= 0x01;
    await redis.hset(meta, 'userHeaders', sealed.toString('base64'));
    await publishAll(t.transport, channel, fragments.slice(-1));
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(0);
    const dead = deadLetters(t.transport, channel);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(
      /^integrity-mismatch: sequence headers: the user headers kept in the store did not decrypt/,
    );
  });

  it('completes a sequence stored under the old key after a restart with a new key first', async () => {
    const channel = 'guarantees.encryption.rotation';
    const payload = payloadWithSample();
    const fragments = makeFragments('rotation', payload, FRAGMENT_BYTES, { 'x-note': 'kept' });
    t = await createSequenceTestApp(channel, {
      sequence: { store: new RedisSequenceStore(redis, { prefix, encryption: { keys: [KEY_A] } }) },
    });
    await publishAll(t.transport, channel, fragments.slice(0, -1));
    await t.transport.whenIdle();
    await t.close();

    t = await createSequenceTestApp(channel, {
      sequence: {
        store: new RedisSequenceStore(redis, { prefix, encryption: { keys: [KEY_B, KEY_A] } }),
      },
    });
    const keyIds: string[] = [];
    t.handler.onCall = async () => {
      for (const position of [1, fragments.length]) {
        const stored = await storedBody(keysOf(channel, 'rotation'), position);
        // The key id, as core/encryption-format.ts lays it out: its length at 5, itself from 6.
        keyIds.push(stored.toString('latin1', 6, 6 + stored[5]));
      }
    };
    await publishAll(t.transport, channel, fragments.slice(-1));
    await t.transport.whenIdle();

    // The first fragment stays under the old key, the last was stored under the new one.
    expect(keyIds).toEqual(['key-a', 'key-b']);
    const [delivery] = t.handler.of('rotation');
    expect(delivery.bytes.equals(payload)).toBe(true);
    expect(delivery.payload.headers).toEqual({ 'x-note': 'kept' });
    expect(deadLetters(t.transport, channel)).toHaveLength(0);
  });

  it('reads a body back in ranges, its tag split between the last two, byte-exact', async () => {
    const store = new RedisSequenceStore(redis, {
      prefix,
      readPieceBytes: 64 * KIB,
      encryption: { keys: [KEY_A] },
    });
    // Sealed: 98 bytes more, so that the last range holds only the tag's last 5 bytes.
    const body = randomBytes(2 * 64 * KIB - 98 + 5);
    const { fragments, ref, payload } = sequenceFixture('guarantees.encryption.ranges', [
      body,
      Buffer.from('tail'),
    ]);
    for (const fragment of fragments) {
      await store.accept(fragment, {
        now: Date.now(),
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
      });
    }

    const chunks = await readAll(store.read(ref));

    expect(chunks.length).toBeGreaterThan(2);
    expect(Buffer.concat(chunks).equals(payload)).toBe(true);
  });
});
