import { randomBytes, randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { describeWithServer } from '../../../../test/support/servers';
import { redisClient, useRedis } from '../../../../test/support/redis.fixture';
import { setBodyUncopied } from './redis-body.writer';

const MiB = 1024 * 1024;

describeWithServer('redis', 'setBodyUncopied (Redis at REDIS_URL)', () => {
  const servers = useRedis({ stem: 'nseq-test:writer' });
  let redis: Redis;
  let prefix: string;

  beforeEach(() => {
    redis = servers.client;
    prefix = servers.prefix;
  });

  it('stores the body byte-exact, with its TTL', async () => {
    const body = randomBytes(3 * MiB + 17);
    const key = `${prefix}:a`;
    await expect(setBodyUncopied(redis, key, body, 60_000)).resolves.toBe('OK');
    expect((await redis.getBuffer(key))?.equals(body)).toBe(true);
    const ttl = await redis.pttl(key);
    expect(ttl).toBeGreaterThan(50_000);
    expect(ttl).toBeLessThanOrEqual(60_000);
  });

  it('keeps its place among commands sent before and after it on the connection', async () => {
    const bodies = Array.from({ length: 6 }, (_, index) => randomBytes(MiB + index));
    // Not awaited one by one: plain commands and uncopied ones interleave on the socket, and
    // each reply must go to its own command.
    const replies = await Promise.all(
      bodies.flatMap((body, index) => [
        redis.set(`${prefix}:small:${index}`, `v${index}`),
        setBodyUncopied(redis, `${prefix}:big:${index}`, body, 60_000),
        redis.get(`${prefix}:small:${index}`),
        redis.strlen(`${prefix}:big:${index}`),
      ]),
    );
    expect(replies).toEqual(
      bodies.flatMap((body, index) => ['OK', 'OK', `v${index}`, body.length]),
    );
    for (const [index, body] of bodies.entries()) {
      expect((await redis.getBuffer(`${prefix}:big:${index}`))?.equals(body)).toBe(true);
    }
  });

  it("applies the client's keyPrefix, like any other command", async () => {
    const prefixed = redisClient({ keyPrefix: `${prefix}:p:` });
    try {
      const body = randomBytes(256 * 1024);
      await setBodyUncopied(prefixed, 'body', body, 60_000);
      expect((await redis.getBuffer(`${prefix}:p:body`))?.equals(body)).toBe(true);
      expect(await redis.exists('body')).toBe(0);
    } finally {
      await prefixed.quit();
    }
  });

  it('waits in the offline queue of a client that is not connected yet, then is sent whole', async () => {
    const late = redisClient({ lazyConnect: true });
    try {
      const body = randomBytes(2 * MiB);
      const sending = setBodyUncopied(late, `${prefix}:late`, body, 60_000);
      expect(late.status).not.toBe('ready');
      await expect(sending).resolves.toBe('OK');
      expect((await redis.getBuffer(`${prefix}:late`))?.equals(body)).toBe(true);
    } finally {
      await late.quit();
    }
  });

  it('falls back to the plain encoding inside a pipeline, and inside MULTI', async () => {
    const bodies = [randomBytes(300 * 1024), randomBytes(200 * 1024)];
    // The same command object the writer builds, queued in a pipeline and in a transaction.
    const pipeline = redis.pipeline();
    pipeline.set(`${prefix}:p:before`, 'x');
    const sending = setBodyUncopied(
      pipeline as unknown as Redis,
      `${prefix}:p:0`,
      bodies[0],
      60_000,
    );
    pipeline.get(`${prefix}:p:before`);
    const replies = await pipeline.exec();
    await sending;
    expect(replies?.map(([, reply]) => reply)).toEqual(['OK', 'OK', 'x']);
    const multi = redis.multi();
    void setBodyUncopied(multi as unknown as Redis, `${prefix}:m:1`, bodies[1], 60_000);
    multi.strlen(`${prefix}:m:1`);
    expect((await multi.exec())?.map(([, reply]) => reply)).toEqual(['OK', bodies[1].length]);
    expect((await redis.getBuffer(`${prefix}:p:0`))?.equals(bodies[0])).toBe(true);
    expect((await redis.getBuffer(`${prefix}:m:1`))?.equals(bodies[1])).toBe(true);
  });

  it('is sent again whole, never in part, when the connection drops while bodies are being written', async () => {
    const name = `nseq-writer-${randomUUID()}`;
    const writer = redisClient({ connectionName: name });
    try {
      await writer.ping();
      let reconnects = 0;
      writer.on('reconnecting', () => reconnects++);
      const bodies = Array.from({ length: 4 }, () => randomBytes(16 * MiB));
      const sets = bodies.map((body, index) =>
        setBodyUncopied(writer, `${prefix}:drop:${index}`, body, 60_000),
      );
      // Killed from the server side while the 64 MiB are on their way.
      const clients = String(await redis.client('LIST'));
      const id = /id=(\d+)[^\n]*name=/.exec(
        clients.split('\n').find((line) => line.includes(`name=${name}`)) ?? '',
      )?.[1];
      expect(id).toBeDefined();
      await redis.client('KILL', 'ID', id!);
      const results = await Promise.allSettled(sets);

      for (const [index, result] of results.entries()) {
        const stored = await redis.getBuffer(`${prefix}:drop:${index}`);
        // A SET that resolved stored its body whole; none stored a part of one.
        if (result.status === 'fulfilled') expect(stored?.equals(bodies[index])).toBe(true);
        else expect(stored === null || stored.equals(bodies[index])).toBe(true);
      }
      expect(reconnects).toBeGreaterThanOrEqual(1);
      // ioredis resends what was not answered: here every SET got through.
      expect(results.map((result) => result.status)).toEqual(bodies.map(() => 'fulfilled'));
      // And the connection is in step again.
      expect(await writer.set(`${prefix}:after`, 'ok')).toBe('OK');
      expect(await writer.get(`${prefix}:after`)).toBe('ok');
    } finally {
      writer.disconnect();
    }
  });

  it('rejects, and stores nothing, when the server refuses the command', async () => {
    const refused = redisClient();
    try {
      // SET takes any key; a TTL of 0 is what the server refuses.
      await expect(setBodyUncopied(refused, `${prefix}:bad`, randomBytes(1024), 0)).rejects.toThrow(
        /invalid expire time/,
      );
      expect(await redis.exists(`${prefix}:bad`)).toBe(0);
      // The connection is still in step: the next command gets its own reply.
      expect(await refused.ping()).toBe('PONG');
    } finally {
      await refused.quit();
    }
  });
});
