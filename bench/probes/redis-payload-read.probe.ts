/**
 * How fast `RedisPayloadStore.get` reads a 256 MiB payload back, and how much ArrayBuffer memory
 * it holds at its peak, with and without `unsafeSocketTricks` (direct reads), in a bare process
 * (no Nest, no broker). No benchmark covers the Redis payload store (bench:claim-check runs on the
 * filesystem store). Each mode runs in a process of its own; run it several times, alternating:
 *
 *   node -r ts-node/register/transpile-only -r tsconfig-paths/register \
 *     bench/probes/redis-payload-read.probe.ts client|direct
 *
 * The figures in docs/claim-check.md ("Redis") come from it. Prints one JSON line (`case`: the
 * mode); its keys (`nseq-probe-payload-<run>:*`) are removed at the end, also on failure or Ctrl-C.
 */
import { Readable } from 'node:stream';
import { RedisPayloadStore } from 'nest-sequence/redis';
import { onCleanup, runBench } from '../harness/cleanup';
import { MiB } from '../harness/measure';
import { report } from '../harness/report';
import { connectRedis, deleteKeysWhenDone, newRunId } from '../harness/resources';
import { servers } from '../harness/settings';

const PREFIX = `nseq-probe-payload-${newRunId()}`;

async function main(): Promise<void> {
  const mode = process.argv[2];
  if (mode !== 'client' && mode !== 'direct') throw new Error('usage: … client | direct');
  deleteKeysWhenDone(servers.redisUrl, PREFIX);
  const redis = connectRedis(servers.redisUrl);
  const writer = new RedisPayloadStore(redis, { prefix: PREFIX });
  const now = Date.now();
  const source = Readable.from(
    (function* () {
      for (let index = 0; index < 256; index++) yield Buffer.alloc(MiB, index);
    })(),
  );
  const { ref } = await writer.put(source, { now, expiresAt: now + 600_000, published: true });
  const store = new RedisPayloadStore(redis, {
    prefix: PREFIX,
    unsafeSocketTricks: mode === 'direct',
  });
  const closeStore = onCleanup('close the reading store', () => store.close());
  let peakArrayBuffers = 0;
  const sampler = setInterval(() => {
    peakArrayBuffers = Math.max(peakArrayBuffers, process.memoryUsage().arrayBuffers);
  }, 5);
  const started = Date.now();
  let bytes = 0;
  for await (const chunk of await store.get(ref)) bytes += (chunk as Buffer).length;
  clearInterval(sampler);
  report(
    { bench: 'redis-payload-read', case: mode, variant: 'default', ratio: null },
    {
      mode,
      mib: bytes / MiB,
      ms: Date.now() - started,
      peakArrayBuffersMiB: Math.round(peakArrayBuffers / MiB),
    },
  );
  await closeStore.run();
  await writer.delete(ref);
}

runBench('redis-payload-read', main);
