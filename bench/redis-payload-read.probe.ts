/**
 * How fast `RedisPayloadStore.get` reads a 256 MiB payload back, and how much ArrayBuffer memory
 * it holds at its peak, with and without `unsafeSocketTricks` (direct reads), in a bare process
 * (no Nest, no broker).
 * Each mode runs in a process of its own; run it several times, alternating:
 *
 *   node -r ts-node/register/transpile-only bench/redis-payload-read.probe.ts client
 *   node -r ts-node/register/transpile-only bench/redis-payload-read.probe.ts direct
 *
 * The figures in docs/claim-check.md ("Redis") come from it.
 */
import { Readable } from 'node:stream';
import { Redis } from 'ioredis';
import { RedisPayloadStore } from '../libs/sequence/src/adapters/payload/redis/redis.payload-store';

const MiB = 1024 * 1024;
const PREFIX = `nseq-probe-payload-${process.pid}`;

async function main(): Promise<void> {
  const mode = process.argv[2];
  if (mode !== 'client' && mode !== 'direct') throw new Error('usage: … client | direct');
  const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
  const writer = new RedisPayloadStore(redis, { prefix: PREFIX });
  const now = Date.now();
  const source = Readable.from(
    (function* () {
      for (let index = 0; index < 256; index++) yield Buffer.alloc(MiB, index);
    })(),
  );
  const { ref } = await writer.put(source, { now, expiresAt: now + 600_000, published: true });
  try {
    const store = new RedisPayloadStore(redis, {
      prefix: PREFIX,
      unsafeSocketTricks: mode === 'direct',
    });
    let peakArrayBuffers = 0;
    const sampler = setInterval(() => {
      peakArrayBuffers = Math.max(peakArrayBuffers, process.memoryUsage().arrayBuffers);
    }, 5);
    const started = Date.now();
    let bytes = 0;
    for await (const chunk of await store.get(ref)) bytes += (chunk as Buffer).length;
    clearInterval(sampler);
    console.log(
      JSON.stringify({
        mode,
        mib: bytes / MiB,
        ms: Date.now() - started,
        peakArrayBuffersMiB: Math.round(peakArrayBuffers / MiB),
      }),
    );
    await store.close();
  } finally {
    await writer.delete(ref);
    await redis.quit();
  }
}

void main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
