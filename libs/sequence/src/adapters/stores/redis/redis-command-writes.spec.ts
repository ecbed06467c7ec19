import { randomBytes, randomUUID } from 'node:crypto';
import { Cluster, Redis } from 'ioredis';
import { describeWithServer } from '../../../../test/support/servers';
import { redisClient } from '../../../../test/support/redis.fixture';
import { countSocketWrites } from '../../../../test/support/socket-writes';
import { setBodyUncopied } from './redis-body.writer';
import { coalesceCommandWrites, withCoalescedWrites } from './redis-command-writes';
import { loadScripts, type RedisClient } from './redis-scripts';

const COMMANDS = 100;

const nextTurn = () => new Promise((resolve) => setImmediate(resolve));

describeWithServer('redis', 'coalesceCommandWrites (Redis at REDIS_URL)', () => {
  let redis: Redis;
  let key: string;

  beforeEach(async () => {
    redis = redisClient();
    await redis.ping();
    key = `nseq-test:writes:${randomUUID()}`;
  });

  afterEach(async () => {
    await redis.del(key);
    await redis.quit();
  });

  /** INCRs the key COMMANDS times in one turn, corking first when asked. */
  function burst(coalesce: boolean): Promise<number[]> {
    const replies: Promise<number>[] = [];
    for (let index = 0; index < COMMANDS; index++) {
      if (coalesce) coalesceCommandWrites(redis);
      replies.push(redis.incr(key));
    }
    return Promise.all(replies);
  }

  const counting = Array.from({ length: COMMANDS }, (_, index) => index + 1);

  it('sends the commands of one turn in one write; each reply goes to its command, in order', async () => {
    const counts = countSocketWrites(redis.stream);
    await expect(burst(true)).resolves.toEqual(counting);
    expect(counts.writes).toBe(1);
    expect(counts.chunks).toBe(COMMANDS);
  });

  it('without it, ioredis writes command by command (the control)', async () => {
    const counts = countSocketWrites(redis.stream);
    await expect(burst(false)).resolves.toEqual(counting);
    // Node merges writes queued behind a partial one, so not always exactly one per command.
    expect(counts.writes).toBeGreaterThan(COMMANDS / 2);
  });

  it('uncorks at the end of the turn, so a command sent in a later turn is not held', async () => {
    coalesceCommandWrites(redis);
    expect(redis.stream.writableCorked).toBe(1);
    coalesceCommandWrites(redis); // corks once per turn, however many commands
    expect(redis.stream.writableCorked).toBe(1);
    await nextTurn();
    expect(redis.stream.writableCorked).toBe(0);
    await expect(redis.incr(key)).resolves.toBe(1);
  });

  it("the store's scripts, with coalesced writes, cork the connection they are sent on", async () => {
    const scripts = withCoalescedWrites(redis, loadScripts(redis));
    const reply = scripts['rsq-inspect'](
      [`{${key}}:s`, `{${key}}:b`, `{${key}}:h`],
      [1, Date.now()],
    );
    expect(redis.stream.writableCorked).toBe(1);
    await reply.catch(() => undefined); // the reply's shape is the store's business, not this test's
    expect(redis.stream.writableCorked).toBe(0);
  });

  it("the store's scripts as loaded leave the connection uncorked (the default)", async () => {
    const reply = loadScripts(redis)['rsq-inspect'](
      [`{${key}}:s`, `{${key}}:b`, `{${key}}:h`],
      [1, Date.now()],
    );
    expect(redis.stream.writableCorked).toBe(0);
    await reply.catch(() => undefined);
  });

  it('works on the new socket after a reconnect', async () => {
    const first = redis.stream;
    first.destroy();
    await new Promise((resolve) => redis.once('ready', resolve));
    expect(redis.stream).not.toBe(first);
    const counts = countSocketWrites(redis.stream);
    await expect(burst(true)).resolves.toEqual(counting);
    expect(counts.writes).toBe(1);
  });

  it('keeps a large uncopied body whole and in its place when the socket is corked', async () => {
    const body = randomBytes(8 * 1024 * 1024 + 5);
    const big = `${key}:big`;
    coalesceCommandWrites(redis);
    const replies = Promise.all([
      redis.incr(key),
      setBodyUncopied(redis, big, body, 60_000),
      redis.incr(key),
      redis.strlen(big),
    ]);
    expect(redis.stream.writableCorked).toBe(1);
    await expect(replies).resolves.toEqual([1, 'OK', 2, body.length]);
    expect((await redis.getBuffer(big))?.equals(body)).toBe(true);
    await redis.del(big);
  });

  it('leaves a Cluster client (no socket of its own) alone', () => {
    const cluster = new Cluster([{ host: '127.0.0.1', port: 1 }], { lazyConnect: true });
    expect(() => coalesceCommandWrites(cluster as RedisClient)).not.toThrow();
    cluster.disconnect();
  });
});
