import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';

/** A key prefix of the test's own: nothing else on the server shares it. */
export function newPrefix(): string {
  return `nseq-fault:${randomUUID()}`;
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
  return `${prefix}:{${channel}:${sequenceId}}:crc`;
}
