import { randomBytes, randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { describeWithServer } from '../../../../test/support/servers';
import { redisClient, useRedis } from '../../../../test/support/redis.fixture';
import {
  directReadsConnections,
  killDirectReadsConnection,
} from '../../../../test/support/direct-reads-connections';
import { RedisDirectReads, type DirectReadsTiming } from './redis-direct-reads';

const MiB = 1024 * 1024;

describeWithServer('redis', 'RedisDirectReads (Redis at REDIS_URL)', () => {
  const opened: RedisDirectReads[] = [];
  const servers = useRedis({
    stem: 'nseq-test:direct',
    beforeCleanup: async () => {
      await Promise.all(opened.splice(0).map((reads) => reads.close()));
    },
  });
  let redis: Redis;
  let prefix: string;

  const directReads = (
    client: Redis = redis,
    timing: DirectReadsTiming = { idleCloseMs: 10_000, retryAfterMs: 1_000 },
  ): RedisDirectReads => {
    const reads = new RedisDirectReads(client, timing);
    opened.push(reads);
    return reads;
  };

  beforeEach(() => {
    redis = servers.client;
    prefix = servers.prefix;
  });

  it('reads ranges byte-exact, many in flight at once, each as views of few socket chunks', async () => {
    const body = randomBytes(5 * MiB + 3);
    await redis.set(`${prefix}:body`, body);
    const reads = directReads();
    const ranges = Array.from({ length: 6 }, (_, index) => [index * MiB, (index + 1) * MiB - 1]);
    const replies = await Promise.all(
      ranges.map(([start, end]) => reads.getRange(`${prefix}:body`, start, end)),
    );
    replies.forEach((parts, index) => {
      const [start, end] = ranges[index];
      expect(Buffer.concat(parts ?? []).equals(body.subarray(start, end + 1))).toBe(true);
    });
    // Not copied into one Buffer per reply: a MiB comes in the socket's chunks.
    expect(replies[0]?.length).toBeGreaterThan(1);
  });

  it("applies the client's keyPrefix; a missing key reads as empty, as GETRANGE answers", async () => {
    const prefixed = redisClient({ keyPrefix: `${prefix}:p:` });
    try {
      await prefixed.ping(); // ready: direct reads wait for the client to be
      await redis.set(`${prefix}:p:body`, 'abcdef');
      const reads = directReads(prefixed);
      expect(Buffer.concat((await reads.getRange('body', 1, 3)) ?? []).toString()).toBe('bcd');
      await expect(reads.getRange('missing', 0, 9)).resolves.toEqual([]);
      expect(Buffer.concat((await reads.getRange('body', 9, 12)) ?? [])).toHaveLength(0);
    } finally {
      await prefixed.quit();
    }
  });

  it("rejects a read with Redis's error, and goes on serving the next ones", async () => {
    await redis.hset(`${prefix}:hash`, 'f', 'v');
    await redis.set(`${prefix}:body`, 'xyz');
    const reads = directReads();
    const [failed, next] = await Promise.allSettled([
      reads.getRange(`${prefix}:hash`, 0, 1),
      reads.getRange(`${prefix}:body`, 0, 2),
    ]);
    expect(failed).toMatchObject({ status: 'rejected', reason: { message: /^WRONGTYPE/ } });
    expect(next.status === 'fulfilled' && Buffer.concat(next.value ?? []).toString()).toBe('xyz');
  });

  it('opens one named connection, closes it when idle, and opens another at the next read', async () => {
    const name = `${prefix.replace(/:/g, '-')}`;
    const named = redisClient({ connectionName: name });
    try {
      await named.ping();
      await redis.set(`${prefix}:body`, 'abc');
      const reads = directReads(named, { idleCloseMs: 100, retryAfterMs: 1_000 });
      await reads.getRange(`${prefix}:body`, 0, 2);
      await reads.getRange(`${prefix}:body`, 0, 2);
      expect(await directReadsConnections(redis, name)).toHaveLength(1);
      await sleep(300);
      expect(await directReadsConnections(redis, name)).toHaveLength(0);
      expect(Buffer.concat((await reads.getRange(`${prefix}:body`, 0, 2)) ?? []).toString()).toBe(
        'abc',
      );
      expect(await directReadsConnections(redis, name)).toHaveLength(1);
    } finally {
      await named.quit();
    }
  });

  it('opens a new connection after the server closed an idle one, without refusing a read', async () => {
    const name = `${prefix.replace(/:/g, '-')}`;
    const named = redisClient({ connectionName: name });
    try {
      await named.ping();
      await redis.set(`${prefix}:body`, 'abc');
      const reads = directReads(named);
      await reads.getRange(`${prefix}:body`, 0, 2);
      expect(await killDirectReadsConnection(redis, name)).toBe(1);
      await sleep(50);
      expect(Buffer.concat((await reads.getRange(`${prefix}:body`, 0, 2)) ?? []).toString()).toBe(
        'abc',
      );
    } finally {
      await named.quit();
    }
  });

  it('fails the reads waiting on a connection that stays silent, then refuses reads for a while', async () => {
    await redis.set(`${prefix}:body`, 'abc');
    const reads = directReads(redis, { idleCloseMs: 10_000, retryAfterMs: 300, stallMs: 100 });
    await reads.getRange(`${prefix}:body`, 0, 2);
    const witness = redisClient();
    try {
      await witness.ping();
      // Redis answers no client for 400 ms: the read waits past its stall limit.
      await redis.client('PAUSE', 400, 'ALL');
      // Answered once Redis answers again.
      const resumed = witness.ping().then(() => 'Redis answered again');
      const read = reads.getRange(`${prefix}:body`, 0, 2).then(
        () => 'the read answered',
        (error: unknown) => error,
      );
      // Failed at its stall limit, while Redis was still silent, not when it answered again.
      const first = await Promise.race([read, resumed]);
      expect(first).toBeInstanceOf(Error);
      expect(first).toMatchObject({ message: expect.stringMatching(/no reply for 100 ms/) });
      await expect(reads.getRange(`${prefix}:body`, 0, 2)).rejects.toThrow(/failed recently/);
      await resumed;
    } finally {
      witness.disconnect();
    }
    await sleep(500);
    expect(Buffer.concat((await reads.getRange(`${prefix}:body`, 0, 2)) ?? []).toString()).toBe(
      'abc',
    );
  });

  it('reads from the database the client is on, also one it selected after it connected', async () => {
    const selecting = redisClient();
    try {
      await selecting.select(3);
      await selecting.ping();
      await selecting.set(`${prefix}:db3`, 'in three', 'PX', 60_000);
      const reads = directReads(selecting);
      expect(Buffer.concat((await reads.getRange(`${prefix}:db3`, 0, 7)) ?? []).toString()).toBe(
        'in three',
      );
      await selecting.select(4);
      await selecting.set(`${prefix}:db3`, 'in four!', 'PX', 60_000);
      expect(Buffer.concat((await reads.getRange(`${prefix}:db3`, 0, 7)) ?? []).toString()).toBe(
        'in four!',
      );
    } finally {
      await selecting.quit();
    }
  });

  it('refuses reads while its client is not ready, whose database it does not know yet', async () => {
    const lazy = redisClient({ lazyConnect: true });
    try {
      const reads = directReads(lazy);
      await expect(reads.getRange(`${prefix}:body`, 0, 2)).rejects.toThrow(/not ready/);
      await lazy.connect();
      await redis.set(`${prefix}:body`, 'abc');
      expect(Buffer.concat((await reads.getRange(`${prefix}:body`, 0, 2)) ?? []).toString()).toBe(
        'abc',
      );
    } finally {
      lazy.disconnect();
    }
  });

  it('counts a refusal every read would get (NOPERM) as a failure, and refuses reads for a while', async () => {
    const user = `nseq-test-${randomUUID()}`;
    await redis.call('ACL', 'SETUSER', user, 'on', '>secret', '~*', '+@all', '-getrange');
    const limited = redisClient({ username: user, password: 'secret' });
    try {
      await limited.ping();
      const reads = directReads(limited);
      await expect(reads.getRange(`${prefix}:body`, 0, 2)).rejects.toThrow(/^NOPERM/);
      await expect(reads.getRange(`${prefix}:body`, 0, 2)).rejects.toThrow(/failed recently/);
    } finally {
      limited.disconnect();
      await redis.call('ACL', 'DELUSER', user);
    }
  });

  it('answers getRangeOrNothing with the parts of a whole reply, and nothing for a short or refused one', async () => {
    await redis.set(`${prefix}:body`, 'abcdef');
    const reads = directReads();
    const parts = await reads.getRangeOrNothing(`${prefix}:body`, 1, 3, (bytes) => bytes === 3);
    expect(Buffer.concat(parts ?? []).toString()).toBe('bcd');
    // Short: a missing key reads as no bytes.
    await expect(
      reads.getRangeOrNothing(`${prefix}:missing`, 0, 3, (bytes) => bytes === 4),
    ).resolves.toBeUndefined();
    await reads.close();
    await expect(
      reads.getRangeOrNothing(`${prefix}:body`, 1, 3, (bytes) => bytes === 3),
    ).resolves.toBeUndefined();
  });

  it('rejects the reads waiting when it is closed, and refuses later ones', async () => {
    await redis.set(`${prefix}:body`, randomBytes(8 * MiB));
    const reads = directReads();
    await reads.getRange(`${prefix}:body`, 0, 0);
    const waiting = reads.getRange(`${prefix}:body`, 0, 8 * MiB - 1);
    await reads.close();
    await expect(waiting).rejects.toThrow(/closed/);
    await expect(reads.getRange(`${prefix}:body`, 0, 0)).rejects.toThrow(/closed/);
  });
});
