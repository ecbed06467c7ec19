/**
 * How much memory plain ioredis holds while it reads bodies back at full speed, with no library
 * code involved: 8 bodies of 8 MiB, read 8 times over (512 MiB), either whole (GET) or in 1 MiB
 * GETRANGE pieces with 4 in flight (what RedisSequenceStore reads through ioredis), or in the
 * same pieces through RedisDirectReads (what it reads with `unsafeSocketTricks`: replies parsed
 * on a connection of its own, without copying). Prints the time, and the peaks of RSS and of
 * ArrayBuffer memory (live or dead and not yet collected), sampled every 5 ms: one JSON line per
 * mode (`case`).
 *
 *   node -r ts-node/register/transpile-only -r tsconfig-paths/register \
 *     bench/probes/redis-read-memory.probe.ts [pieces|whole|direct]
 *
 * One mode per process gives cleaner peaks (the modes run one after the other otherwise).
 *
 * The point of reference for the module consumer's peak RSS in docs/benchmarks.md, which
 * bench:sequence measures with the library around the client: most of a streaming consumer's
 * peak is Buffers the collector has not reclaimed yet, and a bare client shows the same. Its keys
 * (`nseq-probe:<run>:*`) are removed at the end, also on failure or Ctrl-C.
 */
import type { Redis } from 'ioredis';
import { runBench } from '../harness/cleanup';
import { MiB } from '../harness/measure';
import { report } from '../harness/report';
import { connectRedis, deleteKeysWhenDone, newRunId } from '../harness/resources';
import { servers } from '../harness/settings';
import { RedisDirectReads } from './redis-read-memory.internals';
const BODIES = 8;
const ROUNDS = 8;
const PIECE = MiB;
const IN_FLIGHT = 4;

const MODES = ['pieces', 'whole', 'direct'] as const;
type Mode = (typeof MODES)[number];

async function readAll(redis: Redis, keys: string[], mode: Mode): Promise<void> {
  const direct = new RedisDirectReads(redis);
  for (let round = 0; round < ROUNDS; round++) {
    for (const key of keys) {
      if (mode === 'whole') {
        await redis.getBuffer(key);
        continue;
      }
      const pending: Array<Promise<unknown>> = [];
      for (let start = 0; start < 8 * MiB; start += PIECE) {
        const end = start + PIECE - 1;
        pending.push(
          mode === 'direct'
            ? direct.getRange(key, start, end)
            : redis.getrangeBuffer(key, start, end),
        );
        if (pending.length >= IN_FLIGHT) await pending.shift();
      }
      await Promise.all(pending);
    }
  }
  await direct.close();
}

async function main(): Promise<void> {
  const prefix = `nseq-probe:${newRunId()}`;
  deleteKeysWhenDone(servers.redisUrl, prefix);
  const redis = connectRedis(servers.redisUrl);
  const keys = Array.from({ length: BODIES }, (_, index) => `${prefix}:${index}`);
  const body = Buffer.alloc(8 * MiB, 7);
  for (const key of keys) await redis.set(key, body, 'PX', 120_000);
  await redis.ping(); // ready: direct reads go through the client until it is
  const argument = process.argv[2];
  if (argument !== undefined && !(MODES as readonly string[]).includes(argument)) {
    throw new Error(`usage: … [${MODES.join('|')}]`);
  }
  const modes: readonly Mode[] = argument ? [argument as Mode] : MODES;
  for (const mode of modes) {
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
    report(
      { bench: 'redis-read-memory', case: mode, variant: 'default', ratio: null },
      {
        mode,
        mib: BODIES * ROUNDS * 8,
        ms: Date.now() - started,
        peakRssMiB: Math.round(peakRss / MiB),
        peakArrayBuffersMiB: Math.round(peakArrayBuffers / MiB),
      },
    );
  }
}

runBench('redis-read-memory', main);
