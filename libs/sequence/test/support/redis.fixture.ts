/**
 * The tests' Redis: the server at `REDIS_URL` (see ./servers.ts). Wrap the block in
 * `describeWithServer('redis', …)`; {@link useRedis} gives it a client and a key prefix per test,
 * and deletes the test's keys after it.
 */
import { randomUUID } from 'node:crypto';
import { Redis, type RedisOptions } from 'ioredis';
import { SERVERS } from './servers';

/** A new client of the test Redis (the caller quits it). */
export function redisClient(options: RedisOptions = {}): Redis {
  return new Redis(SERVERS.redis.url, options);
}

/** A key prefix of the test's own, `<stem>:<uuid>`: nothing else on the server shares it. */
export function newPrefix(stem = 'nseq-fault'): string {
  return `${stem}:${randomUUID()}`;
}

/** Every key under `prefix`, by SCAN (never KEYS: the server may be shared). */
export async function keysUnder(redis: Redis, prefix: string): Promise<string[]> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
    keys.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  return keys;
}

export async function deleteUnder(redis: Redis, prefix: string): Promise<void> {
  const keys = await keysUnder(redis, prefix);
  for (let i = 0; i < keys.length; i += 500) await redis.del(...keys.slice(i, i + 500));
}

/** The key of one sequence's CRC hash, whose field count is the number of positions stored. */
export function crcKey(prefix: string, channel: string, sequenceId: string): string {
  // Channels made by the fault tests have none of the characters the store percent-encodes.
  return `${prefix}:{seq:${channel}:${sequenceId}}:crc`;
}

/** What {@link useRedis} connected, and the current test's key prefix. */
export interface RedisFixture {
  /** Connected before the block's tests, quit after them. */
  readonly client: Redis;
  /** Fresh for each test (`<stem>:<uuid>`); its keys are deleted after it. */
  readonly prefix: string;
}

export interface RedisFixtureOptions {
  /** The prefixes' first part. @default 'nseq-test' */
  readonly stem?: string;
  /** Runs after each test, before its keys are deleted: close what uses them. */
  readonly beforeCleanup?: () => Promise<void>;
}

/**
 * Registers, in the calling describe block, a Redis client for its tests, a fresh key prefix
 * per test, and the deletion of each test's keys after it. Call it before the block's own hooks.
 */
export function useRedis(options: RedisFixtureOptions = {}): RedisFixture {
  let client: Redis | undefined;
  let prefix: string | undefined;
  beforeAll(() => {
    client = redisClient();
  });
  beforeEach(() => {
    prefix = newPrefix(options.stem ?? 'nseq-test');
  });
  afterEach(async () => {
    try {
      await options.beforeCleanup?.();
    } finally {
      if (client && prefix) await deleteUnder(client, prefix);
      prefix = undefined;
    }
  });
  afterAll(async () => {
    await client?.quit();
  });
  return {
    get client() {
      if (!client) throw new Error('useRedis: no client outside the block');
      return client;
    },
    get prefix() {
      if (!prefix) throw new Error('useRedis: no prefix outside a test');
      return prefix;
    },
  };
}
