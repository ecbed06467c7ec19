import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { RedisResequencerStore } from 'nest-sequence/redis';
import type { ResequencedEntry, ResequencerKey } from 'nest-sequence/ports';
import { describeWithServer } from '../support/servers';
import { keysUnder, useRedis } from '../support/redis.fixture';
import { valuesContaining } from '../support/redis-raw-values';
import { eventually } from '../support/sequence-test-app';
import {
  createResequencerTestApp,
  publishEvent,
  type ResequencerTestApp,
} from './resequencer-test-app';

const KEY_A = { id: 'key-a', key: randomBytes(32) };
const KEY_B = { id: 'key-b', key: randomBytes(32) };
const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;
const LIMITS = { maxBufferedPerKey: 100, maxBufferedTotal: 1_000 };

/**
 * The resequencer store with `encryption`: Redis holds no plaintext of an event's body or
 * headers; an event altered in Redis is dead-lettered as an integrity failure, never handed to
 * the handler; events stored under a retired key are still delivered after a rotation.
 */
describeWithServer('redis', 'Resequencer: encryption at rest (Redis store)', () => {
  let t: ResequencerTestApp | undefined;
  const servers = useRedis({
    stem: 'nseq-test:rsq-encryption',
    beforeCleanup: async () => {
      await t?.close();
      t = undefined;
    },
  });
  let redis: Redis;
  let prefix: string;
  /** 64 random bytes in every event's body, and as hex in a header. */
  let sample: Buffer;
  const key: ResequencerKey = { scope: 'transfers', key: 'T1' };

  beforeEach(() => {
    redis = servers.client;
    prefix = servers.prefix;
    sample = randomBytes(64);
  });

  /** Its body starts with 9 bytes, so that the sample's base64 shows in the body's base64. */
  function event(seq: number): ResequencedEntry {
    return {
      seq,
      body: Buffer.concat([Buffer.from(`event ${seq}: `), sample]),
      headers: { 'x-patient': sample.toString('hex') },
    };
  }

  const at = (now: number) => ({ start: 1, limits: LIMITS, now });
  const drain = (now: number) => ({ holder: 'a', leaseMs: 10_000, limit: 10, now });

  it.each([
    ['holds none of', { encryption: { keys: [KEY_A] } }, 0],
    // The same scan finds them without encryption: the test can see plaintext when it is there.
    ['holds, without encryption, the body and the header of each', {}, 3],
  ] as const)(
    'Redis %s the events buffered and waiting in the hand-off list',
    async (_label, options, expected) => {
      const store = new RedisResequencerStore(redis, { prefix, ...options });
      const now = Date.now();
      await store.accept(key, event(3), at(now));
      await store.accept(key, event(1), at(now));
      await store.accept(key, event(4), at(now));

      expect(await valuesContaining(redis, prefix, sample)).toBe(0);
      expect(await valuesContaining(redis, prefix, sample.toString('base64'))).toBe(expected);
      expect(await valuesContaining(redis, prefix, sample.toString('hex'))).toBe(expected);
      await expect(store.claimDrain(key, drain(now))).resolves.toEqual({
        kind: 'claimed',
        items: [{ kind: 'event', entry: event(1) }],
      });
      await store.close();
    },
  );

  it('dead-letters, never calling the handler, an event whose stored ciphertext changed', async () => {
    const channel = 'rsq.encryption.tampered';
    t = await createResequencerTestApp(
      { channel, gap: GAP },
      {
        resequencer: {
          store: new RedisResequencerStore(redis, { prefix, encryption: { keys: [KEY_A] } }),
        },
      },
    );

    await publishEvent(t.transport, channel, 'T1', 2, 'second');
    await t.transport.whenIdle();
    await alterBufferedEntry();
    await publishEvent(t.transport, channel, 'T1', 1, 'first');
    await publishEvent(t.transport, channel, 'T1', 3, 'third');
    await eventually(() => t!.handler.of('T1').length === 2, 'events 1 and 3');

    expect(t.handler.received.map(({ seq, body }) => [seq, body])).toEqual([
      [1, 'first'],
      [3, 'third'],
    ]);
    const dead = t.transport.peek(`${channel}.dlq`);
    expect(dead).toHaveLength(1);
    expect(dead[0].body.length).toBe(0);
    expect(String(dead[0].headers['x-death-reason'])).toMatch(
      /^integrity-mismatch: key T1, event 2: the stored event did not decrypt \(authentication-failed, key id "key-a"\)/,
    );
  });

  it('delivers events stored under the old key after a restart with a new key first', async () => {
    const before = new RedisResequencerStore(redis, { prefix, encryption: { keys: [KEY_A] } });
    const now = Date.now();
    await before.accept(key, event(2), at(now));
    await before.close();

    const after = new RedisResequencerStore(redis, {
      prefix,
      encryption: { keys: [KEY_B, KEY_A] },
    });
    await after.accept(key, event(1), at(now));
    const onlyNewKey = new RedisResequencerStore(redis, { prefix, encryption: { keys: [KEY_B] } });

    await expect(after.claimDrain(key, drain(now))).resolves.toEqual({
      kind: 'claimed',
      items: [
        { kind: 'event', entry: event(1) },
        { kind: 'event', entry: event(2) },
      ],
    });
    // Event 1 went in under the new key, event 2 stays under the old one.
    await expect(onlyNewKey.claimDrain(key, drain(now + 20_000))).resolves.toMatchObject({
      kind: 'claimed',
      items: [
        { kind: 'event', entry: event(1) },
        {
          kind: 'undecryptable',
          seq: 2,
          detail: expect.stringMatching(/unknown-key, key id "key-a"/),
        },
      ],
    });
    await after.close();
    await onlyNewKey.close();
  });

  /** Flips one base64 character of the sealed entry buffered in Redis (the only one). */
  async function alterBufferedEntry(): Promise<void> {
    for (const name of await keysUnder(redis, prefix)) {
      if ((await redis.type(name)) !== 'zset') continue;
      const members = await redis.zrange(name, 0, -1, 'WITHSCORES');
      for (let i = 0; i < members.length; i += 2) {
        const member = members[i];
        const at = member.indexOf('"x":"') + 5 + 150;
        if (at < 155) continue;
        const altered = `${member.slice(0, at)}${member[at] === 'A' ? 'B' : 'A'}${member.slice(at + 1)}`;
        await redis.zrem(name, member);
        await redis.zadd(name, members[i + 1], altered);
        return;
      }
    }
    throw new Error('no sealed entry buffered');
  }
});
