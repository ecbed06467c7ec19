/**
 * Message Sequence over RabbitMQ (or NATS JetStream) and Redis, against the broker's plain client
 * moving the same bytes in the same fragments, in the same run, on the same servers.
 *
 *   npm run bench:sequence                          RabbitMQ
 *   BENCH_TRANSPORT=nats npm run bench:sequence     NATS JetStream
 *
 * This process is the producer; each consumer runs in a process of its own (forked, as plain
 * JavaScript) so that its peak RSS is its own:
 * (a) raw: amqplib confirm channel, `inFlight` publishes awaiting their confirm, persistent
 *     messages on a durable queue → amqplib consumer with `prefetch` and manual ack, counting bytes.
 * (b) module: SplitterService → RabbitMqTransport → @SequencedHandler with RedisSequenceStore,
 *     the handler reading payload.stream() to the end.
 * Per case: one warm-up round (discarded), then `BENCH_ROUNDS` rounds alternating a and b; one
 * JSON line on stdout with the medians, the median of the per-round ratios b/a, the consumers'
 * peak RSS, and where the time went (phases of b, CPU seconds per process, Redis commands).
 * After every variant's ratio cases, a 500 MB case per variant through (b), streamed by the
 * producer, reporting the consumer's peak RSS.
 * Progress and logs go to stderr.
 *
 * Environment (defaults in brackets):
 *   AMQP_URL [amqp://guest:guest@127.0.0.1:5672]   REDIS_URL [redis://127.0.0.1:6379]
 *   BENCH_MB [180]  BENCH_FRAGMENTS_MIB [8,1]  BENCH_ROUNDS [3]
 *   BENCH_TRACING [0; 1 registers an OpenTelemetry SDK in the producer and the module consumer,
 *     see harness/tracing.ts; the raw baseline has no spans to record]
 *   BENCH_PREFETCH [library default, 16]  BENCH_IN_FLIGHT [library default, 2]   (a and b alike;
 *     b's prefetch is then lowered by the library's prefetchBytes, reported as modulePrefetch)
 *
 * BENCH_TRANSPORT=nats [NATS_URL nats://127.0.0.1:4222] runs the same cases on NATS JetStream
 * (`bench: sequence-nats`, `sequence-nats-500`): (a) is plain @nats-io/jetstream, `js.publish`
 * awaiting each PubAck with `inFlight` at once, to a work-queue stream of its own, consumed
 * through a durable pull consumer (`consume()` holding `prefetch`), each message acked; (b) is
 * the module over NatsTransport. Fragments default to the largest the module makes on that
 * server (its max_payload, 1 MiB unless configured, less the transport's and the module's header
 * room): BENCH_FRAGMENTS_MIB and BENCH_500_FRAGMENT_MIB must stay at or under it.
 *   BENCH_BUFFER [both; store or broker]: the module consumer's sequence.buffer; broker-held lines
 *     have `-broker-held` appended to their `variant` and their own raw baseline in the same run
 *   BENCH_PARTITIONS [library default, 4]  BENCH_WINDOW [library default, 1024]   (broker-held)
 *   BENCH_500 [1; 0 skips]  BENCH_500_MB [500]  BENCH_500_FRAGMENT_MIB [8]
 *   BENCH_500_PREFETCH [BENCH_PREFETCH]  BENCH_RSS_SAMPLE_MS [10]  BENCH_RUN_TIMEOUT_S [300]
 *   BENCH_READ_AHEAD [store default, 4]: RedisSequenceStore readAhead, in pieces (b only)
 *   BENCH_CPU_PROF_DIR [unset; when set, consumers run with --cpu-prof into that directory]
 *   BENCH_CONSUMER_ENV [unset]: NAME=VALUE pairs, comma-separated, added to both consumers'
 *     environment only (e.g. MALLOC_MMAP_THRESHOLD_=1048576, see docs/message-sequence.md on
 *     a consumer's memory); echoed as `consumerEnv` in every result line
 *   BENCH_CONSUMER_NODE_ARGS [none]: more Node options for both consumers, space-separated,
 *     e.g. `--trace-gc`; echoed as `consumerNodeArgs` in the result lines when set
 *   BENCH_UNSAFE_SOCKET_TRICKS [off; on, or both: every case without, then every case with]:
 *     the producer's and the module consumer's `unsafeSocketTricks` (transport and store);
 *     echoed as `unsafeSocketTricks` in every result line
 *   BENCH_ENCRYPTION [off; on, or both: every case without, then every case with]: the module
 *     consumer's RedisSequenceStore encrypts (`encryption`, one random key per run); such lines
 *     have `-encrypted` appended to their `variant` (`encrypted`, `socket-tricks-encrypted`)
 *
 * Queues (`nseq-bench.<id>.*`) and Redis keys (prefix `nseq-bench-<id>`) are unique to the run
 * and removed at the end, as are the consumer processes, also on failure or Ctrl-C
 * (harness/cleanup.ts); the exit code is non-zero on any error. Each line has the harness's
 * envelope: `case` (`8MiB`, `1MiB`: the fragment size; `streamed-500MiB`), `variant` (`default`,
 * `socket-tricks`) and `at`.
 */
import 'reflect-metadata';
import { randomBytes } from 'node:crypto';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import type { SplitterService } from 'nest-sequence';
import { BenchChild } from './harness/child-process';
import { runBench } from './harness/cleanup';
import { progress } from './harness/log';
import { nestLogger } from './harness/nest-logger';
import { buildPlainJs, type PlainJsBuild } from './harness/plain-js-build';
import { mbPerSecond, MiB, ratiosOf, report, round1, round2, variantOf } from './harness/report';
import { connectRedis, deleteKeysWhenDone, newRunId } from './harness/resources';
import { roundsOf } from './harness/rounds';
import {
  choiceSetting,
  envPairsSetting,
  optionalPositiveInteger,
  positiveInteger,
  positiveNumber,
  positiveNumberList,
  readSettings,
  servers,
  socketTrickVariants,
  switchSetting,
  textSetting,
  wordsSetting,
} from './harness/settings';
import { NatsBenchBroker } from './sequence-nats.broker';
import { RabbitMqBenchBroker, type BenchBroker } from './sequence-rabbitmq.brokers';
import { LIBRARY_DEFAULTS, largestNatsFragmentMiB } from './sequence-rabbitmq.internals';
import { slices, startProducer, streamed } from './sequence-rabbitmq.producer';
import type {
  ConsumerConfig,
  ConsumerMode,
  FromConsumer,
  ToConsumer,
} from './sequence-rabbitmq.protocol';
import { RunDriver, type Consumer, type RunFigures } from './sequence-rabbitmq.runs';
import {
  bigCaseFigures,
  caseFigures,
  phasesOf,
  BROKER_HELD_RATIO_TARGET,
  BROKER_HELD_RSS_TARGET_MIB,
  RATIO_TARGETS,
  type LineSettings,
} from './sequence-rabbitmq.summary';
import { registerBenchTracing } from './harness/tracing';

registerBenchTracing();

const settings = readSettings(() => {
  const prefetch = positiveInteger('BENCH_PREFETCH', LIBRARY_DEFAULTS.prefetch);
  const transport = choiceSetting('BENCH_TRANSPORT', ['rabbitmq', 'nats'], 'rabbitmq');
  // NATS: the largest fragment the module makes on a server of the default max_payload (1 MiB).
  const fragmentMiB = transport === 'nats' ? String(largestNatsFragmentMiB()) : undefined;
  return {
    transport,
    url: transport === 'nats' ? servers.natsUrl : servers.amqpUrl,
    redisUrl: servers.redisUrl,
    totalBytes: Math.round(positiveNumber('BENCH_MB', 180) * MiB),
    /** Empty: no 180 MB cases (e.g. to run the 500 MB case alone). */
    fragmentsMiB: positiveNumberList('BENCH_FRAGMENTS_MIB', fragmentMiB ?? '8,1'),
    rounds: positiveInteger('BENCH_ROUNDS', 3),
    prefetch,
    inFlight: positiveInteger('BENCH_IN_FLIGHT', LIBRARY_DEFAULTS.inFlight),
    /** The Redis store's readAhead (b only); unset keeps the store's default (4). */
    readAhead: optionalPositiveInteger('BENCH_READ_AHEAD'),
    big: switchSetting('BENCH_500', true),
    bigBytes: Math.round(positiveNumber('BENCH_500_MB', 500) * MiB),
    bigFragmentMiB: positiveNumber('BENCH_500_FRAGMENT_MIB', Number(fragmentMiB ?? 8)),
    bigPrefetch: positiveInteger('BENCH_500_PREFETCH', prefetch),
    rssSampleMs: positiveNumber('BENCH_RSS_SAMPLE_MS', 10),
    runTimeoutMs: positiveNumber('BENCH_RUN_TIMEOUT_S', 300) * 1000,
    cpuProfileDir: textSetting('BENCH_CPU_PROF_DIR'),
    consumerEnv: envPairsSetting('BENCH_CONSUMER_ENV'),
    consumerNodeArgs: wordsSetting('BENCH_CONSUMER_NODE_ARGS'),
    socketTricks: socketTrickVariants(),
    encryption: onOffBoth('BENCH_ENCRYPTION'),
    buffers: bufferModes(),
    partitions: positiveInteger('BENCH_PARTITIONS', LIBRARY_DEFAULTS.partitions),
    window: positiveInteger('BENCH_WINDOW', LIBRARY_DEFAULTS.window),
  };
});

/** BENCH_BUFFER: the module consumer's `sequence.buffer`, or both, one after the other. */
function bufferModes(): Array<'store' | 'broker'> {
  const value = choiceSetting('BENCH_BUFFER', ['store', 'broker', 'both'], 'both');
  return value === 'both' ? ['store', 'broker'] : [value];
}

const runId = newRunId();
const queuePrefix = `nseq-bench.${runId}`;
const redisPrefix = `nseq-bench-${runId}`;
/** The module consumer's store key when a variant encrypts: 32 random bytes, base64. */
const encryptionKey = randomBytes(32).toString('base64');

function onOffBoth(name: string): boolean[] {
  const value = choiceSetting(name, ['off', 'on', 'both'], 'off');
  return value === 'both' ? [false, true] : [value === 'on'];
}

/**
 * The result lines' `variant`: the socket tricks', `-encrypted` appended when the store encrypts,
 * `broker-held` for broker-held reassembly.
 */
function variantName(variant: Variant): string {
  const name = `${variantOf(variant.unsafeSocketTricks)}${variant.encryption ? '-encrypted' : ''}`;
  const held = variant.buffer === 'broker' ? `${name}-broker-held` : name;
  return held.replace(/^default-/, '');
}

/** What `send` adds for the variant's buffer mode. */
function sendOptions(variant: Variant): { buffer?: 'broker'; partitions?: number } {
  return variant.buffer === 'broker' ? { buffer: 'broker', partitions: settings.partitions } : {};
}

/** The partitions of the module path's channel. */
function partitionsOf(variant: Variant): number {
  return variant.buffer === 'broker' ? settings.partitions : 0;
}

/** What every case of one variant shares. */
interface Variant {
  broker: BenchBroker;
  splitter: SplitterService;
  build: PlainJsBuild;
  runs: RunDriver;
  /** The module path's `unsafeSocketTricks` (producer and consumer). */
  unsafeSocketTricks: boolean;
  /** The module consumer's store encrypts. */
  encryption: boolean;
  /** The module consumer's `sequence.buffer`. */
  buffer: 'store' | 'broker';
}

function startConsumer(
  variant: Variant,
  mode: ConsumerMode,
  queue: string,
  consumerPrefetch: number,
  label: string,
): Promise<Consumer> {
  const config: ConsumerConfig = {
    mode,
    transport: settings.transport,
    url: settings.url,
    queue,
    prefetch: consumerPrefetch,
    redisUrl: settings.redisUrl,
    redisPrefix,
    readAhead: settings.readAhead,
    unsafeSocketTricks: variant.unsafeSocketTricks,
    encryptionKey: variant.encryption ? encryptionKey : undefined,
    rssSampleMs: settings.rssSampleMs,
    buffer: variant.buffer,
    partitions: settings.partitions,
    window: settings.window,
  };
  return BenchChild.start<ToConsumer, FromConsumer>({
    label,
    entry: join(__dirname, 'sequence-rabbitmq.consumer.ts'),
    build: variant.build,
    config,
    env: settings.consumerEnv,
    cpuProfileDir: settings.cpuProfileDir,
    nodeArgs: settings.consumerNodeArgs,
  });
}

/** `8MiB`, `1MiB`; a fragment size of NATS's, `0.98MiB`. */
function caseName(fragmentMiB: number): string {
  return `${round2(fragmentMiB)}MiB`;
}

async function runCase(variant: Variant, payload: Buffer, fragmentMiB: number): Promise<void> {
  const fragmentBytes = Math.round(fragmentMiB * MiB);
  const label = `${caseName(fragmentMiB)}${variant.unsafeSocketTricks ? '-tricks' : ''}${variant.encryption ? '-encrypted' : ''}${variant.buffer === 'broker' ? '-held' : ''}`;
  const { broker } = variant;
  const rawQueue = `${queuePrefix}.${label.replace('.', '_')}.raw`;
  const moduleQueue = `${queuePrefix}.${label.replace('.', '_')}.module`;
  await broker.declareRaw(rawQueue);
  broker.trackModule(moduleQueue, partitionsOf(variant));

  const [rawConsumer, moduleConsumer] = await Promise.all([
    startConsumer(variant, 'raw', rawQueue, settings.prefetch, `raw ${label}`),
    startConsumer(variant, 'module', moduleQueue, settings.prefetch, `module ${label}`),
  ]);
  const raw: RunFigures[] = [];
  const module: RunFigures[] = [];
  for (const round of roundsOf({ rounds: settings.rounds, warmUp: true, alternate: false })) {
    const tag = round.label;
    const a = await variant.runs.run(rawConsumer, `${label} ${tag} a`, payload.length, () =>
      broker.publishRaw(rawQueue, slices(payload, fragmentBytes), settings.inFlight),
    );
    await broker.assertDrained(rawQueue, 'raw');
    const b = await variant.runs.run(moduleConsumer, `${label} ${tag} b`, payload.length, () =>
      variant.splitter.send(moduleQueue, payload, { fragmentBytes, ...sendOptions(variant) }),
    );
    await broker.assertDrained(moduleQueue, 'module', partitionsOf(variant));
    await broker.assertDrained(`${moduleQueue}.dlq`, 'module dead letters');
    progress(
      `${label} ${tag}: a ${mbPerSecond(payload.length, a.seconds)} MB/s (rss ${a.hwmRssMiB ?? a.peakRssMiB} MiB), ` +
        `b ${mbPerSecond(payload.length, b.seconds)} MB/s (rss ${b.hwmRssMiB ?? b.peakRssMiB} MiB, ` +
        `peak ${JSON.stringify(b.peak)}), ` +
        `ratio ${round2(a.seconds / b.seconds)}; b phases ${JSON.stringify(phasesOf(b))}; ` +
        `cpu a ${JSON.stringify(a.cpu)} b ${JSON.stringify(b.cpu)}`,
    );
    if (round.warmUp) continue;
    raw.push(a);
    module.push(b);
  }
  await Promise.all([rawConsumer.stop(), moduleConsumer.stop()]);

  report(
    {
      bench: broker.bench,
      case: caseName(fragmentMiB),
      variant: variantName(variant),
      ratio: ratiosOf(
        raw.map((a, i) => ({
          baseline: payload.length / a.seconds,
          module: payload.length / module[i].seconds,
        })),
      ).ratio,
    },
    caseFigures({
      ...lineSettings(variant, settings.prefetch),
      bytes: payload.length,
      fragmentMiB,
      raw,
      module,
      idleRssMiB: { raw: rawConsumer.ready.idleRssMiB, module: moduleConsumer.ready.idleRssMiB },
      modulePrefetch: moduleConsumer.ready.prefetch,
      ratioTarget:
        variant.buffer === 'broker' ? BROKER_HELD_RATIO_TARGET : RATIO_TARGETS[broker.transport],
    }),
  );
}

async function runBigCase(variant: Variant): Promise<void> {
  const fragmentBytes = Math.round(settings.bigFragmentMiB * MiB);
  const label = `big-${caseName(settings.bigFragmentMiB)}${variant.unsafeSocketTricks ? '-tricks' : ''}${variant.encryption ? '-encrypted' : ''}${variant.buffer === 'broker' ? '-held' : ''}`;
  const queue = `${queuePrefix}.${label.replace('.', '_')}.module`;
  variant.broker.trackModule(queue, partitionsOf(variant));
  const consumer = await startConsumer(
    variant,
    'module',
    queue,
    settings.bigPrefetch,
    `module ${label}`,
  );
  const block = randomBytes(MiB);
  const b = await variant.runs.run(consumer, `${label} b`, settings.bigBytes, () =>
    variant.splitter.send(queue, streamed(settings.bigBytes, block), {
      fragmentBytes,
      ...sendOptions(variant),
    }),
  );
  await variant.broker.assertDrained(queue, 'module', partitionsOf(variant));
  await variant.broker.assertDrained(`${queue}.dlq`, 'module dead letters');
  await consumer.stop();
  report(
    {
      bench: `${variant.broker.bench}-500`,
      case: `streamed-${settings.bigBytes / MiB}MiB`,
      variant: variantName(variant),
      ratio: null,
    },
    bigCaseFigures({
      ...lineSettings(variant, settings.bigPrefetch),
      bytes: settings.bigBytes,
      fragmentMiB: settings.bigFragmentMiB,
      run: b,
      idleRssMiB: consumer.ready.idleRssMiB,
      modulePrefetch: consumer.ready.prefetch,
      ...(variant.buffer === 'broker' && { rssTargetMiB: BROKER_HELD_RSS_TARGET_MIB }),
    }),
  );
}

/** What every result line of a variant echoes of the settings. */
function lineSettings(variant: Variant, prefetch: number): LineSettings {
  return {
    unsafeSocketTricks: variant.unsafeSocketTricks,
    rounds: settings.rounds,
    prefetch,
    inFlight: settings.inFlight,
    readAhead: settings.readAhead,
    consumerEnv: settings.consumerEnv,
    consumerNodeArgs: settings.consumerNodeArgs,
  };
}

async function checkRedis(redis: Redis): Promise<void> {
  const largest = Math.max(settings.totalBytes, settings.big ? settings.bigBytes : 0);
  const largestFragment = Math.max(...settings.fragmentsMiB, settings.bigFragmentMiB) * MiB;
  try {
    const [, maxmemory] = (await redis.config('GET', 'maxmemory')) as [string, string];
    const [, bulk] = (await redis.config('GET', 'proto-max-bulk-len')) as [string, string];
    const [, policy] = (await redis.config('GET', 'maxmemory-policy')) as [string, string];
    const used = Number(/^used_memory:(\d+)/m.exec(await redis.info('memory'))?.[1] ?? 0);
    progress(
      `redis maxmemory ${Number(maxmemory) / MiB} MiB (0: none), policy ${policy}, ` +
        `proto-max-bulk-len ${Number(bulk) / MiB} MiB, used ${round1(used / MiB)} MiB`,
    );
    if (Number(bulk) < largestFragment + 64 * 1024) {
      throw new Error(
        `Redis proto-max-bulk-len (${bulk}) is below a ${largestFragment}-byte fragment`,
      );
    }
    // One sequence at a time is held whole until its handler is done, plus headroom.
    if (Number(maxmemory) > 0 && Number(maxmemory) - used < largest * 1.25) {
      throw new Error(
        `Redis has ${round1((Number(maxmemory) - used) / MiB)} MiB free under maxmemory; ` +
          `the benchmark holds up to ${largest / MiB} MiB at once`,
      );
    }
  } catch (error) {
    if (error instanceof Error && /unknown command|CONFIG/i.test(error.message)) {
      progress(`could not read Redis CONFIG (${error.message}); going on`);
    } else {
      throw error;
    }
  }
}

async function main(): Promise<void> {
  Logger.overrideLogger(nestLogger('producer'));
  progress(
    `run ${runId} on ${settings.transport}: ${cpus().length} cores, node ${process.version}; ${settings.totalBytes / MiB} MiB in ` +
      `${settings.fragmentsMiB.join(', ')} MiB fragments, ${settings.rounds} rounds + 1 warm-up; ` +
      `prefetch ${settings.prefetch}, inFlight ${settings.inFlight}`,
  );

  const build = buildPlainJs();
  deleteKeysWhenDone(settings.redisUrl, redisPrefix);
  const redis = connectRedis(settings.redisUrl);
  await checkRedis(redis);

  const broker =
    settings.transport === 'nats'
      ? await NatsBenchBroker.connect(settings.url)
      : await RabbitMqBenchBroker.connect(settings.url, queuePrefix);

  const payload = randomBytes(settings.totalBytes);
  // Every variant's ratio cases first, then the streamed cases: once this process has streamed
  // 500 MiB in 8 MiB fragments, V8 collects its old generation every few fragments rather than
  // scavenging, and each later send costs its producer two to three times the CPU, on both
  // paths. A ratio case must not depend on which cases ran before it.
  const passes = settings.big ? (['ratio', 'streamed'] as const) : (['ratio'] as const);
  for (const pass of passes) {
    for (const unsafeSocketTricks of settings.socketTricks) {
      const producer = await startProducer(
        () => broker.connectTransport(unsafeSocketTricks),
        settings.inFlight,
      );
      for (const [encryption, buffer] of settings.encryption.flatMap((each) =>
        settings.buffers.map((mode) => [each, mode] as const),
      )) {
        const variant: Variant = {
          broker,
          splitter: producer.splitter,
          build,
          runs: new RunDriver(redis, settings.runTimeoutMs, broker.server),
          unsafeSocketTricks,
          encryption,
          buffer,
        };
        if (pass === 'streamed') await runBigCase(variant);
        else {
          for (const fragmentMiB of settings.fragmentsMiB) {
            await runCase(variant, payload, fragmentMiB);
          }
        }
      }
      await producer.close();
    }
  }
}

runBench('sequence', main);
