/**
 * Probe behind the "where the time goes" section of docs/benchmarks.md: what one fragment body
 * costs Redis (and the client) along the paths a store could take, and how much Buffer memory a
 * Node client holds while reading bodies back. No library code: plain ioredis.
 *
 *   node --expose-gc -r ts-node/register/transpile-only bench/redis-body-path.probe.ts
 *
 * Environment: REDIS_URL [redis://127.0.0.1:6379], PROBE_BODY_MIB [8], PROBE_BODIES [16].
 * Keys are `nseq-probe-<pid>-*`, deleted at the end.
 *
 * 1. Write and read one body N times per path, reporting client ms/op, Redis CPU ms/op (INFO cpu)
 *    and server time per command (INFO commandstats, which counts commands run inside scripts):
 *    - EVAL with the body as an argument and HSET inside (what the store's accept script does);
 *    - HSET of the body directly;
 *    - MULTI { SET <body key> ; EVAL that only records the position } (the body outside Lua);
 *    - HGET, GET.
 * 2. Read 63 bodies twice with 2 reads ahead (the store's read pattern, SHA-256 check then
 *    handler), reporting peak RSS and ArrayBuffer memory; again with a forced GC after each body
 *    when --expose-gc is given, to tell live bodies from Buffers waiting for the collector.
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';

const MiB = 1024 * 1024;
const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const bodyBytes = Number(process.env.PROBE_BODY_MIB ?? 8) * MiB;
const count = Number(process.env.PROBE_BODIES ?? 16);
const prefix = `nseq-probe-${process.pid}`;

async function serverCounters(): Promise<{ cpu: number; usec: Record<string, number> }> {
  const [cpu, stats] = await Promise.all([redis.info('cpu'), redis.info('commandstats')]);
  const field = (name: string) => Number(new RegExp(`^${name}:([\\d.]+)`, 'm').exec(cpu)?.[1]);
  const usec: Record<string, number> = {};
  for (const match of stats.matchAll(/^cmdstat_([^:]+):calls=\d+,usec=(\d+)/gm)) {
    usec[match[1]] = Number(match[2]);
  }
  return { cpu: field('used_cpu_sys') + field('used_cpu_user'), usec };
}

async function paths(body: Buffer): Promise<void> {
  const store = "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1";
  const admit = "redis.call('HSET', KEYS[1], ARGV[1], '1') return 1";
  const cases: Array<[string, (i: number) => Promise<unknown>]> = [
    ['EVAL with body argument, HSET inside', (i) => redis.eval(store, 1, `${prefix}:e`, i, body)],
    ['HSET body', (i) => redis.hset(`${prefix}:h`, String(i), body)],
    [
      'MULTI { SET body key ; EVAL admit }',
      (i) => redis.multi().set(`${prefix}:s:${i}`, body).eval(admit, 1, `${prefix}:m`, i).exec(),
    ],
    ['HGET body', (i) => redis.hgetBuffer(`${prefix}:h`, String(i))],
    ['GET body key', (i) => redis.getBuffer(`${prefix}:s:${i}`)],
  ];
  console.log(`${count} bodies of ${bodyBytes / MiB} MiB per path`);
  for (const [label, run] of cases) {
    const before = await serverCounters();
    const started = Date.now();
    for (let i = 0; i < count; i++) await run(i);
    const clientMs = (Date.now() - started) / count;
    const after = await serverCounters();
    const server = Object.entries(after.usec)
      .map(([command, usec]) => [command, (usec - (before.usec[command] ?? 0)) / count] as const)
      .filter(([command, usec]) => usec >= 50 && command !== 'info')
      .map(([command, usec]) => `${command} ${(usec / 1000).toFixed(1)}`)
      .join(', ');
    console.log(
      `  ${label.padEnd(40)} client ${clientMs.toFixed(1).padStart(5)} ms/op   ` +
        `redis cpu ${(((after.cpu - before.cpu) * 1000) / count).toFixed(1).padStart(5)} ms/op   ` +
        `server ms/op: ${server}`,
    );
  }
}

async function readBack(forceGc: boolean): Promise<void> {
  const key = `${prefix}:read`;
  const bodies = 63;
  const body = randomBytes(bodyBytes);
  for (let i = 1; i <= bodies; i++) await redis.hset(key, String(i), body);
  const gc = (globalThis as { gc?: () => void }).gc;
  gc?.();
  await new Promise((resolve) => setTimeout(resolve, 200));
  const idle = process.memoryUsage.rss();
  let peak = idle;
  let buffersAtPeak = 0;
  const timer = setInterval(() => {
    const { rss, arrayBuffers } = process.memoryUsage();
    if (rss > peak) [peak, buffersAtPeak] = [rss, arrayBuffers];
  }, 10);
  const started = Date.now();
  for (let pass = 0; pass < 2; pass++) {
    const pending: Array<Promise<Buffer | null>> = [];
    let next = 1;
    const fill = () => {
      while (pending.length < 2 && next <= bodies)
        pending.push(redis.hgetBuffer(key, String(next++)));
    };
    fill();
    while (pending.length > 0) {
      await pending.shift();
      fill();
      if (forceGc) gc?.();
    }
  }
  const seconds = (Date.now() - started) / 1000;
  clearInterval(timer);
  await redis.unlink(key);
  console.log(
    `  read ${bodies} bodies twice, 2 ahead${forceGc ? ', gc() after each' : ''}: ` +
      `rss ${(idle / MiB).toFixed(0)} → peak ${(peak / MiB).toFixed(0)} MiB, ` +
      `ArrayBuffers at peak ${(buffersAtPeak / MiB).toFixed(0)} MiB, ` +
      `${((2 * bodies * bodyBytes) / MiB / seconds).toFixed(0)} MB/s`,
  );
}

async function main(): Promise<void> {
  try {
    await paths(randomBytes(bodyBytes));
    await readBack(false);
    if ((globalThis as { gc?: () => void }).gc) await readBack(true);
  } finally {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) await redis.unlink(...keys);
    } while (cursor !== '0');
    await redis.quit();
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
