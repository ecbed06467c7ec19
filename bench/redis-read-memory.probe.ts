/**
 * How much memory plain ioredis holds while it reads bodies back at full speed, with no library
 * code involved: 8 bodies of 8 MiB, read 8 times over (512 MiB), either whole (GET) or in 1 MiB
 * GETRANGE pieces with 4 in flight (what RedisSequenceStore.read does). Prints the time, and the
 * peaks of RSS and of ArrayBuffer memory (live or dead and not yet collected), sampled every 5 ms.
 *
 *   node -r ts-node/register/transpile-only bench/redis-read-memory.probe.ts
 *
 * The point of reference for the module consumer's peak RSS in docs/benchmarks.md: most of a
 * streaming consumer's peak is Buffers the collector has not reclaimed yet, and a bare client
 * shows the same.
 */
import { Redis } from 'ioredis';

const MiB = 1024 * 1024;
const BODIES = 8;
const ROUNDS = 8;
const PIECE = MiB;
const IN_FLIGHT = 4;

async function readAll(redis: Redis, keys: string[], mode: 'whole' | 'pieces'): Promise<void> {
  for (let round = 0; round < ROUNDS; round++) {
    for (const key of keys) {
      if (mode === 'whole') {
        await redis.getBuffer(key);
        continue;
      }
      const pending: Array<Promise<Buffer>> = [];
      for (let start = 0; start < 8 * MiB; start += PIECE) {
        pending.push(redis.getrangeBuffer(key, start, start + PIECE - 1));
        if (pending.length >= IN_FLIGHT) await pending.shift();
      }
      await Promise.all(pending);
    }
  }
}

async function main(): Promise<void> {
  const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
  const prefix = `nseq-probe:${process.pid}`;
  const keys = Array.from({ length: BODIES }, (_, index) => `${prefix}:${index}`);
  try {
    const body = Buffer.alloc(8 * MiB, 7);
    for (const key of keys) await redis.set(key, body, 'PX', 120_000);
    for (const mode of ['pieces', 'whole'] as const) {
      let peakRss = 0;
      let peakArrayBuffers = 0;
      const sampler = setInterval(() => {
        const usage = process.memoryUsage();
        peakRss = Math.max(peakRss, usage.rss);
        peakArrayBuffers = Math.max(peakArrayBuffers, usage.arrayBuffers);
      }, 5);
      const started = Date.now();
      await readAll(redis, keys, mode);
      clearInterval(sampler);
      console.log(
        JSON.stringify({
          mode,
          mib: BODIES * ROUNDS * 8,
          ms: Date.now() - started,
          peakRssMiB: Math.round(peakRss / MiB),
          peakArrayBuffersMiB: Math.round(peakArrayBuffers / MiB),
        }),
      );
    }
  } finally {
    await redis.del(...keys);
    await redis.quit();
  }
}

void main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
