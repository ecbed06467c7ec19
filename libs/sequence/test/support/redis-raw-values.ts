import type { Redis } from 'ioredis';
import { keysUnder } from './redis.fixture';

/**
 * Every byte Redis holds under `prefix`: each key's name and raw value (strings whole; hash
 * fields and values; set, sorted-set and list members), as Buffers, to search for plaintext.
 */
export async function rawValuesUnder(redis: Redis, prefix: string): Promise<Buffer[]> {
  const values: Buffer[] = [];
  for (const key of await keysUnder(redis, prefix)) {
    values.push(Buffer.from(key));
    const type = await redis.type(key);
    switch (type) {
      case 'string':
        values.push((await redis.getBuffer(key)) ?? Buffer.alloc(0));
        break;
      case 'hash':
        for (const [field, value] of Object.entries(await redis.hgetallBuffer(key))) {
          values.push(Buffer.from(field), value);
        }
        break;
      case 'zset':
        values.push(...(await redis.zrangeBuffer(key, 0, -1)));
        break;
      case 'set':
        values.push(...(await redis.smembersBuffer(key)));
        break;
      case 'list':
        values.push(...(await redis.lrangeBuffer(key, 0, -1)));
        break;
      case 'none':
        break;
      default:
        throw new Error(`key ${key} has type ${type}, which this helper cannot read`);
    }
  }
  return values;
}

/** The raw values under `prefix` that contain `needle`, as a count (0: none hold it). */
export async function valuesContaining(
  redis: Redis,
  prefix: string,
  needle: Buffer | string,
): Promise<number> {
  return (await rawValuesUnder(redis, prefix)).filter((value) => value.includes(needle)).length;
}
