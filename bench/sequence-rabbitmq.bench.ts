/**
 * Message Sequence over RabbitMQ and Redis, against plain amqplib moving the same bytes in the
 * same fragments, in the same run, on the same servers.
 *
 *   npm run bench:sequence
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
 * Then a 500 MB case through (b), streamed by the producer, reporting the consumer's peak RSS.
 * Progress and logs go to stderr.
 *
 * Environment (defaults in brackets):
 *   AMQP_URL [amqp://guest:guest@127.0.0.1:5672]   REDIS_URL [redis://127.0.0.1:6379]
 *   BENCH_MB [180]  BENCH_FRAGMENTS_MIB [8,1]  BENCH_ROUNDS [3]
 *   BENCH_PREFETCH [library default, 16]  BENCH_IN_FLIGHT [library default, 2]   (a and b alike;
 *     b's prefetch is then lowered by the library's prefetchBytes, reported as modulePrefetch)
 *   BENCH_500 [1; 0 skips]  BENCH_500_MB [500]  BENCH_500_FRAGMENT_MIB [8]
 *   BENCH_500_PREFETCH [BENCH_PREFETCH]  BENCH_RSS_SAMPLE_MS [10]  BENCH_RUN_TIMEOUT_S [300]
 *   BENCH_READ_AHEAD [store default, 4]: RedisSequenceStore readAhead, in pieces (b only)
 *   BENCH_CPU_PROF_DIR [unset; when set, consumers run with --cpu-prof into that directory]
 *   BENCH_CONSUMER_ENV [unset]: NAME=VALUE pairs, comma-separated, added to both consumers'
 *     environment only (e.g. MALLOC_MMAP_THRESHOLD_=1048576, see docs/message-sequence.md on
 *     a consumer's memory); echoed as `consumerEnv` in every result line
 *   BENCH_UNSAFE_SOCKET_TRICKS [off; on, or both: every case without, then every case with]:
 *     the producer's and the module consumer's `unsafeSocketTricks` (transport and store);
 *     echoed as `unsafeSocketTricks` in every result line
 *
 * Queues (`nseq-bench.<id>.*`) and Redis keys (prefix `nseq-bench-<id>`) are unique to the run
 * and removed at the end, also on failure or Ctrl-C; the exit code is non-zero on any error.
 */
import 'reflect-metadata';
import { fork, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { cpus } from 'node:os';
import { rmSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { ConsoleLogger, Logger, Module, type INestApplicationContext } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import * as amqp from 'amqplib';
import { Redis } from 'ioredis';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { SEQUENCE_DEFAULTS } from '../libs/sequence/src/sequence.options';
import { SequenceModule, SplitterService } from 'nest-sequence';
import { MiB, median, report, socketTrickVariants } from './bench.util';
import { buildPlainJs, type PlainJsBuild } from './harness/plain-js-build';
import {
  busiestProcessNamed,
  cpuSecondsOf,
  machineCpuSeconds,
  ownCpuSeconds,
} from './process-probe';
import {
  epochMs,
  type ConsumerConfig,
  type ConsumerMode,
  type FromConsumer,
  type ModuleTrace,
  type ToConsumer,
} from './sequence-rabbitmq.protocol';

// ------------------------------------------------------------------------------ settings

function numberFromEnv(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a number, got ${raw}`);
  return value;
}

const settings = {
  amqpUrl: process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672',
  redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
  totalBytes: numberFromEnv('BENCH_MB', 180) * MiB,
  /** Empty: no 180 MB cases (e.g. to run the 500 MB case alone). */
  fragmentsMiB: (process.env.BENCH_FRAGMENTS_MIB ?? '8,1')
    .split(',')
    .filter((item) => item.trim() !== '')
    .map(Number),
  rounds: Math.max(1, Math.floor(numberFromEnv('BENCH_ROUNDS', 3))),
  prefetch: numberFromEnv('BENCH_PREFETCH', SEQUENCE_DEFAULTS.prefetch),
  inFlight: numberFromEnv('BENCH_IN_FLIGHT', SEQUENCE_DEFAULTS.publish.inFlight),
  /** The Redis store's readAhead (b only); unset keeps the store's default (4). */
  readAhead: process.env.BENCH_READ_AHEAD ? numberFromEnv('BENCH_READ_AHEAD', 4) : undefined,
  big: numberFromEnv('BENCH_500', 1) !== 0,
  bigBytes: numberFromEnv('BENCH_500_MB', 500) * MiB,
  bigFragmentMiB: numberFromEnv('BENCH_500_FRAGMENT_MIB', 8),
  rssSampleMs: numberFromEnv('BENCH_RSS_SAMPLE_MS', 10),
  runTimeoutMs: numberFromEnv('BENCH_RUN_TIMEOUT_S', 300) * 1000,
  cpuProfileDir: process.env.BENCH_CPU_PROF_DIR,
  consumerEnv: consumerEnvFrom(process.env.BENCH_CONSUMER_ENV ?? ''),
  socketTricks: socketTrickVariants(),
};
/** `A=1,B=2` → { A: '1', B: '2' }; anything else is refused, not guessed at. */
function consumerEnvFrom(raw: string): Record<string, string> {
  const env: Record<string, string> = {};
  for (const pair of raw.split(',').filter((item) => item.trim() !== '')) {
    const match = /^\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(pair);
    if (!match) throw new Error(`BENCH_CONSUMER_ENV: expected NAME=VALUE, got ${pair}`);
    env[match[1]] = match[2].trim();
  }
  return env;
}

const bigPrefetch = numberFromEnv('BENCH_500_PREFETCH', settings.prefetch);
for (const fragmentMiB of [...settings.fragmentsMiB, settings.bigFragmentMiB]) {
  if (!(fragmentMiB > 0))
    throw new Error(`fragment sizes must be positive MiB, got ${fragmentMiB}`);
}
const BIG_RSS_TARGET_MIB = 200;
const RATIO_TARGET = 0.35;

const runId = `${process.pid}-${randomBytes(3).toString('hex')}`;
const queuePrefix = `nseq-bench.${runId}`;
const redisPrefix = `nseq-bench-${runId}`;
const root = resolve(__dirname, '..');

/** Progress and diagnostics: stderr, so that stdout carries only the JSON result lines. */
function progress(line: string): void {
  process.stderr.write(`[bench:sequence] ${line}\n`);
}

class StderrLogger extends ConsoleLogger {
  protected override printMessages(...args: Parameters<ConsoleLogger['printMessages']>): void {
    super.printMessages(args[0], args[1], args[2], 'stderr', args[4]);
  }
}

// ------------------------------------------------------------------------------- cleanup

/** Undo steps, run last-registered first, once, whatever happened. */
const undo: Array<{ name: string; run: () => Promise<void> | void }> = [];
let cleaning: Promise<boolean> | undefined;

function onCleanup(name: string, run: () => Promise<void> | void): void {
  undo.push({ name, run });
}

function cleanUp(): Promise<boolean> {
  cleaning ??= (async () => {
    let clean = true;
    for (let step = undo.pop(); step; step = undo.pop()) {
      try {
        await withTimeout(Promise.resolve(step.run()), 20_000, `cleanup: ${step.name}`);
      } catch (error) {
        clean = false;
        progress(`cleanup step "${step.name}" failed: ${describe(error)}`);
      }
    }
    return clean;
  })();
  return cleaning;
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

async function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

// ----------------------------------------------------------------------- consumer processes

type Received<T extends FromConsumer['type']> = Extract<FromConsumer, { type: T }> & {
  receivedAt: number;
};

/** A forked consumer: its messages in arrival order, each stamped with its arrival time. */
class ConsumerProcess {
  private readonly inbox: Array<FromConsumer & { receivedAt: number }> = [];
  private failure?: Error;
  private stopping = false;
  private wake: () => void = () => {};
  private readonly exited: Promise<void>;
  /** RSS once started and connected, before any message. */
  idleRssMiB = Number.NaN;
  /** The prefetch of its subscription. */
  prefetch = Number.NaN;

  private constructor(
    private readonly child: ChildProcess,
    readonly label: string,
  ) {
    child.on('message', (message: FromConsumer) => {
      if (message.type === 'error') {
        this.failure ??= new Error(`${label} consumer failed: ${message.message}`);
      } else {
        this.inbox.push({ ...message, receivedAt: epochMs() });
      }
      this.wake();
    });
    this.exited = new Promise((resolveExit) =>
      child.once('exit', (code, signal) => {
        if (!this.stopping) {
          this.failure ??= new Error(`${label} consumer exited unexpectedly (${code ?? signal})`);
        }
        this.wake();
        resolveExit();
      }),
    );
  }

  static async start(build: PlainJsBuild, config: ConsumerConfig, label: string) {
    const execArgv = [...build.execArgv];
    if (settings.cpuProfileDir) {
      execArgv.push('--cpu-prof', `--cpu-prof-dir=${resolve(settings.cpuProfileDir)}`);
      execArgv.push(`--cpu-prof-name=${label.replace(/\W+/g, '-')}-${Date.now()}.cpuprofile`);
    }
    const child = fork(
      build.jsOf(join(root, 'bench/sequence-rabbitmq.consumer.ts')),
      [JSON.stringify(config)],
      {
        execArgv,
        env: { ...process.env, ...build.env, ...settings.consumerEnv },
        // The consumer's stdout (Nest logs) goes to our stderr: our stdout is for results.
        stdio: ['ignore', 2, 2, 'ipc'],
      },
    );
    const consumer = new ConsumerProcess(child, label);
    onCleanup(`stop ${label} consumer`, () => consumer.stop());
    const ready = await consumer.next('ready', 60_000);
    consumer.idleRssMiB = ready.idleRssMiB;
    consumer.prefetch = ready.prefetch;
    return consumer;
  }

  send(message: ToConsumer): void {
    if (this.failure) throw this.failure;
    this.child.send(message);
  }

  /** The next message of `type`; rejects when the consumer fails, exits, or on timeout. */
  async next<T extends FromConsumer['type']>(type: T, timeoutMs: number): Promise<Received<T>> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const index = this.inbox.findIndex((message) => message.type === type);
      if (index >= 0) return this.inbox.splice(index, 1)[0] as Received<T>;
      if (this.failure) throw this.failure;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`${this.label} consumer: no "${type}" within ${timeoutMs} ms`);
      await new Promise<void>((wakeUp) => {
        const timer = setTimeout(wakeUp, left);
        this.wake = () => {
          clearTimeout(timer);
          wakeUp();
        };
      });
    }
  }

  /** Asks it to close and exit; kills it (this one process, by pid) if it does not. */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    this.stopping = true;
    try {
      if (this.child.connected) this.child.send({ type: 'stop' } satisfies ToConsumer);
    } catch {
      // already gone
    }
    const stopped = await Promise.race([
      this.exited.then(() => true),
      new Promise<false>((done) => setTimeout(() => done(false), 10_000)),
    ]);
    if (!stopped) {
      progress(`${this.label} consumer did not exit; killing pid ${this.child.pid}`);
      this.child.kill('SIGKILL');
      await this.exited;
    }
  }
}

// ------------------------------------------------------------------------- measurements

interface RedisCounters {
  cpuSeconds: number;
  commands: Record<string, { calls: number; usec: number }>;
}

async function redisCounters(redis: Redis): Promise<RedisCounters> {
  const [cpu, commandstats] = await Promise.all([redis.info('cpu'), redis.info('commandstats')]);
  const field = (name: string) => Number(new RegExp(`^${name}:([\\d.]+)`, 'm').exec(cpu)?.[1] ?? 0);
  const commands: RedisCounters['commands'] = {};
  for (const match of commandstats.matchAll(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/gm)) {
    commands[match[1]] = { calls: Number(match[2]), usec: Number(match[3]) };
  }
  return { cpuSeconds: field('used_cpu_sys') + field('used_cpu_user'), commands };
}

interface Snapshot {
  at: number;
  producer: number;
  rabbitmq?: number;
  machine?: number;
  redis: RedisCounters;
}

interface RunFigures {
  seconds: number;
  publishSeconds: number;
  peakRssMiB: number;
  hwmRssMiB?: number;
  /** At the sampled peak: ms since t0, V8 heap used, Buffer (ArrayBuffer) memory. */
  peak: { atMs?: number; heapMiB?: number; heapTotalMiB?: number; buffersMiB?: number };
  /** CPU seconds each process used during the run. */
  cpu: { producer: number; consumer: number; rabbitmq?: number; redis: number };
  /** Cores busy on the whole machine during the run, other tenants included (2 = saturated). */
  machineBusyCores?: number;
  /** Redis server time by command during the run (the server is shared: other clients count). */
  redisServerMs: Record<string, number>;
  trace?: ModuleTrace;
  t0: number;
}

class Bench {
  private readonly brokerPid = busiestProcessNamed('beam.smp');

  constructor(
    private readonly redis: Redis,
    private readonly timeoutMs: number,
  ) {}

  private async snapshot(): Promise<Snapshot> {
    return {
      at: epochMs(),
      producer: ownCpuSeconds(),
      rabbitmq: cpuSecondsOf(this.brokerPid),
      machine: machineCpuSeconds(),
      redis: await redisCounters(this.redis),
    };
  }

  /** One run: arm the consumer, publish, stop the clock when the consumer has every byte. */
  async run(
    consumer: ConsumerProcess,
    run: string,
    bytes: number,
    publish: () => Promise<unknown>,
  ): Promise<RunFigures> {
    consumer.send({ type: 'arm', run, bytes });
    await consumer.next('armed', 10_000);
    const before = await this.snapshot();
    const t0 = epochMs();
    let publishedAt = Number.NaN;
    const published = publish().then(() => (publishedAt = epochMs()));
    const done = consumer.next('done', this.timeoutMs);
    // Either failing fails the run at once (the other's later failure is not news).
    published.catch(() => undefined);
    done.catch(() => undefined);
    const [, finished] = await Promise.all([published, done]);
    if (finished.run !== run || finished.bytes !== bytes) {
      throw new Error(
        `${consumer.label}: run ${finished.run} delivered ${finished.bytes} bytes, expected ${bytes}`,
      );
    }
    const settled = await consumer.next('settled', 60_000);
    const after = await this.snapshot();
    const redisServerMs: Record<string, number> = {};
    for (const [command, { usec }] of Object.entries(after.redis.commands)) {
      const delta = usec - (before.redis.commands[command]?.usec ?? 0);
      // Commands run inside scripts count too (hset in evalsha); under 1 ms: others' noise.
      if (delta >= 1000) redisServerMs[command] = Math.round(delta / 100) / 10;
    }
    return {
      seconds: (finished.receivedAt - t0) / 1000,
      publishSeconds: (publishedAt - t0) / 1000,
      peakRssMiB: settled.peakRssMiB,
      hwmRssMiB: settled.hwmRssMiB,
      peak: {
        atMs: settled.peakAt === undefined ? undefined : Math.round(settled.peakAt - t0),
        heapMiB: settled.peakHeapMiB,
        heapTotalMiB: settled.peakHeapTotalMiB,
        buffersMiB: settled.peakBuffersMiB,
      },
      cpu: {
        producer: round2(after.producer - before.producer),
        consumer: settled.cpuSeconds,
        rabbitmq:
          after.rabbitmq !== undefined && before.rabbitmq !== undefined
            ? round2(after.rabbitmq - before.rabbitmq)
            : undefined,
        redis: round2(after.redis.cpuSeconds - before.redis.cpuSeconds),
      },
      machineBusyCores:
        after.machine !== undefined && before.machine !== undefined
          ? round2((after.machine - before.machine) / ((after.at - before.at) / 1000))
          : undefined,
      redisServerMs,
      trace: settled.trace,
      t0,
    };
  }
}

const round1 = (value: number) => Math.round(value * 10) / 10;
const round2 = (value: number) => Math.round(value * 100) / 100;
const mbps = (bytes: number, seconds: number) => round1(bytes / MiB / seconds);

/** Phases of a module run, in ms from the start of publishing (t0) or as durations. */
function phasesOf(figures: RunFigures): Record<string, number> | undefined {
  const trace = figures.trace;
  if (!trace) return undefined;
  const since = (at?: number) => (at === undefined ? Number.NaN : Math.round(at - figures.t0));
  const span = (from?: number, to?: number) =>
    from === undefined || to === undefined ? Number.NaN : Math.round(to - from);
  return {
    publishedAt: Math.round(figures.publishSeconds * 1000),
    firstAcceptAt: since(trace.firstAcceptAt),
    storedAt: since(trace.completeAt),
    readPasses: trace.reads,
    verifyMs: span(trace.verifyStartAt, trace.verifyEndAt),
    handlerMs: span(trace.handlerStartAt, trace.handlerEndAt),
    finishMs: span(trace.handlerEndAt, trace.finishEndAt),
    totalMs: Math.round(figures.seconds * 1000),
    acceptCalls: trace.accepts,
    acceptMsAvg: Math.round(trace.acceptMs / Math.max(1, trace.accepts)),
    maxConcurrentAccepts: trace.maxConcurrentAccepts,
  };
}

/** Field-wise median of records of numbers. */
function medianOf(records: ReadonlyArray<Record<string, number | undefined> | undefined>) {
  const result: Record<string, number> = {};
  const present = records.filter(
    (record): record is Record<string, number | undefined> => !!record,
  );
  for (const key of new Set(present.flatMap((record) => Object.keys(record)))) {
    const values = present
      .map((record) => record[key])
      .filter((value): value is number => value !== undefined && !Number.isNaN(value));
    if (values.length > 0) result[key] = round2(median(values));
  }
  return result;
}

/** Redis commands per run of the module consumer, as its client counted them. */
function redisCallsOf(trace?: ModuleTrace): Record<string, number> {
  return Object.fromEntries(
    Object.entries(trace?.redis ?? {}).map(([name, tally]) => [name, tally.calls]),
  );
}

/** Median CPU seconds per process; busy cores of ours, and of the whole machine (shared). */
function cpuSummary(runs: RunFigures[]) {
  const cpu = medianOf(runs.map((run) => run.cpu));
  const seconds = median(runs.map((run) => run.seconds));
  const total = Object.values(cpu).reduce((sum, value) => sum + value, 0);
  const machine = runs
    .map((run) => run.machineBusyCores)
    .filter((v): v is number => v !== undefined);
  return {
    ...cpu,
    busyCores: round2(total / seconds),
    machineBusyCores: machine.length > 0 ? round2(median(machine)) : undefined,
  };
}

// ---------------------------------------------------------------------------- producers

async function publishRaw(
  channel: amqp.ConfirmChannel,
  queue: string,
  fragments: Iterable<Buffer>,
  inFlight: number,
): Promise<void> {
  const pending = new Set<Promise<void>>();
  let position = 0;
  for (const body of fragments) {
    position++;
    let writable = true;
    const confirmed = new Promise<void>((resolveConfirm, rejectConfirm) => {
      writable = channel.publish(
        '',
        queue,
        body,
        { persistent: true, headers: { 'x-position': position } },
        (error) =>
          error
            ? rejectConfirm(error instanceof Error ? error : new Error(String(error)))
            : resolveConfirm(),
      );
    });
    const settled: Promise<void> = confirmed.finally(() => pending.delete(settled));
    pending.add(settled);
    if (!writable) await once(channel, 'drain');
    if (pending.size >= inFlight) await Promise.race(pending);
  }
  await Promise.all(pending);
}

function* slices(payload: Buffer, fragmentBytes: number): Generator<Buffer> {
  for (let offset = 0; offset < payload.length; offset += fragmentBytes) {
    yield payload.subarray(offset, offset + fragmentBytes);
  }
}

/** `total` bytes as fresh 1 MiB chunks: never the whole payload in memory. */
async function* streamed(total: number, block: Buffer): AsyncGenerator<Buffer> {
  for (let sent = 0; sent < total; sent += block.length) {
    yield Buffer.from(block.subarray(0, Math.min(block.length, total - sent)));
  }
}

// --------------------------------------------------------------------------------- main

interface Servers {
  admin: amqp.Channel;
  raw: amqp.ConfirmChannel;
  redis: Redis;
  splitter: SplitterService;
  build: PlainJsBuild;
  bench: Bench;
  /** The module path's `unsafeSocketTricks` (producer and consumer). */
  unsafeSocketTricks: boolean;
}

/** Every queue this run may have created (declared by us, by the transport, or its `.dlq`). */
const queues = new Set<string>();

function tracked(queue: string): string {
  queues.add(queue);
  return queue;
}

function consumerConfig(
  mode: ConsumerMode,
  queue: string,
  prefetch: number,
  unsafeSocketTricks: boolean,
): ConsumerConfig {
  return {
    mode,
    amqpUrl: settings.amqpUrl,
    queue,
    prefetch,
    redisUrl: settings.redisUrl,
    redisPrefix,
    readAhead: settings.readAhead,
    unsafeSocketTricks,
    rssSampleMs: settings.rssSampleMs,
  };
}

async function assertDrained(servers: Servers, queue: string, what: string): Promise<void> {
  const { messageCount } = await servers.admin.checkQueue(queue);
  if (messageCount > 0) throw new Error(`${messageCount} message(s) left in ${queue} (${what})`);
}

async function runCase(servers: Servers, payload: Buffer, fragmentMiB: number): Promise<void> {
  const fragmentBytes = Math.round(fragmentMiB * MiB);
  const label = `${fragmentMiB}MiB${servers.unsafeSocketTricks ? '-tricks' : ''}`;
  const rawQueue = tracked(`${queuePrefix}.${label}.raw`);
  const moduleQueue = tracked(`${queuePrefix}.${label}.module`);
  queues.add(`${moduleQueue}.dlq`);
  await servers.admin.assertQueue(rawQueue, { durable: true });

  const [rawConsumer, moduleConsumer] = await Promise.all([
    ConsumerProcess.start(
      servers.build,
      consumerConfig('raw', rawQueue, settings.prefetch, servers.unsafeSocketTricks),
      `raw ${label}`,
    ),
    ConsumerProcess.start(
      servers.build,
      consumerConfig('module', moduleQueue, settings.prefetch, servers.unsafeSocketTricks),
      `module ${label}`,
    ),
  ]);
  const raw: RunFigures[] = [];
  const module: RunFigures[] = [];
  for (let round = 0; round <= settings.rounds; round++) {
    const tag = round === 0 ? 'warm-up' : `round ${round}`;
    const a = await servers.bench.run(rawConsumer, `${label} ${tag} a`, payload.length, () =>
      publishRaw(servers.raw, rawQueue, slices(payload, fragmentBytes), settings.inFlight),
    );
    await assertDrained(servers, rawQueue, 'raw');
    const b = await servers.bench.run(moduleConsumer, `${label} ${tag} b`, payload.length, () =>
      servers.splitter.send(moduleQueue, payload, { fragmentBytes }),
    );
    await assertDrained(servers, moduleQueue, 'module');
    await assertDrained(servers, `${moduleQueue}.dlq`, 'module dead letters');
    progress(
      `${label} ${tag}: a ${mbps(payload.length, a.seconds)} MB/s (rss ${a.hwmRssMiB ?? a.peakRssMiB} MiB), ` +
        `b ${mbps(payload.length, b.seconds)} MB/s (rss ${b.hwmRssMiB ?? b.peakRssMiB} MiB, ` +
        `peak ${JSON.stringify(b.peak)}), ` +
        `ratio ${round2(a.seconds / b.seconds)}; b phases ${JSON.stringify(phasesOf(b))}; ` +
        `cpu a ${JSON.stringify(a.cpu)} b ${JSON.stringify(b.cpu)}`,
    );
    if (round === 0) continue; // warm-up
    raw.push(a);
    module.push(b);
  }
  await Promise.all([rawConsumer.stop(), moduleConsumer.stop()]);

  const ratios = raw.map((a, i) => a.seconds / module[i].seconds);
  const everyRound = (figures: RunFigures[], pick: (run: RunFigures) => number | undefined) => {
    const values = figures.map(pick).filter((value): value is number => value !== undefined);
    return values.length > 0 ? Math.max(...values) : undefined;
  };
  report({
    bench: 'sequence-rabbitmq',
    mb: payload.length / MiB,
    fragmentMiB,
    unsafeSocketTricks: servers.unsafeSocketTricks,
    rounds: settings.rounds,
    rawMBps: round1(median(raw.map((run) => mbps(payload.length, run.seconds)))),
    moduleMBps: round1(median(module.map((run) => mbps(payload.length, run.seconds)))),
    ratio: round2(median(ratios)),
    ratios: ratios.map(round2),
    ratioTarget: RATIO_TARGET,
    // Max over the measured rounds: sampled every BENCH_RSS_SAMPLE_MS, and the kernel's VmHWM.
    rawPeakRssMiB: everyRound(raw, (run) => run.peakRssMiB),
    modulePeakRssMiB: everyRound(module, (run) => run.peakRssMiB),
    rawHwmRssMiB: everyRound(raw, (run) => run.hwmRssMiB),
    moduleHwmRssMiB: everyRound(module, (run) => run.hwmRssMiB),
    rawIdleRssMiB: rawConsumer.idleRssMiB,
    moduleIdleRssMiB: moduleConsumer.idleRssMiB,
    // The round of b with the highest sampled peak: when (ms after publishing began) and of what.
    modulePeakDetail: module.reduce((top, run) => (run.peakRssMiB > top.peakRssMiB ? run : top))
      .peak,
    prefetch: settings.prefetch,
    modulePrefetch: moduleConsumer.prefetch,
    inFlight: settings.inFlight,
    readAhead: settings.readAhead ?? 'default (4)',
    consumerEnv: settings.consumerEnv,
    modulePhasesMs: medianOf(module.map(phasesOf)),
    cpuSeconds: { raw: cpuSummary(raw), module: cpuSummary(module) },
    moduleRedisCalls: medianOf(module.map((run) => redisCallsOf(run.trace))),
    moduleRedisServerMs: medianOf(module.map((run) => run.redisServerMs)),
  });
}

async function runBigCase(servers: Servers): Promise<void> {
  const fragmentBytes = Math.round(settings.bigFragmentMiB * MiB);
  const label = `big-${settings.bigFragmentMiB}MiB${servers.unsafeSocketTricks ? '-tricks' : ''}`;
  const queue = tracked(`${queuePrefix}.${label}.module`);
  queues.add(`${queue}.dlq`);
  const consumer = await ConsumerProcess.start(
    servers.build,
    consumerConfig('module', queue, bigPrefetch, servers.unsafeSocketTricks),
    `module ${label}`,
  );
  const block = randomBytes(MiB);
  const b = await servers.bench.run(consumer, `${label} b`, settings.bigBytes, () =>
    servers.splitter.send(queue, streamed(settings.bigBytes, block), { fragmentBytes }),
  );
  await assertDrained(servers, queue, 'module');
  await assertDrained(servers, `${queue}.dlq`, 'module dead letters');
  await consumer.stop();
  const peak = b.hwmRssMiB ?? b.peakRssMiB;
  report({
    bench: 'sequence-rabbitmq-500',
    mb: settings.bigBytes / MiB,
    fragmentMiB: settings.bigFragmentMiB,
    unsafeSocketTricks: servers.unsafeSocketTricks,
    producer: 'streamed (async generator of 1 MiB chunks)',
    moduleMBps: mbps(settings.bigBytes, b.seconds),
    modulePeakRssMiB: b.peakRssMiB,
    moduleHwmRssMiB: b.hwmRssMiB,
    moduleIdleRssMiB: consumer.idleRssMiB,
    modulePeakDetail: b.peak,
    rssTargetMiB: BIG_RSS_TARGET_MIB,
    rssTargetMet: peak < BIG_RSS_TARGET_MIB,
    prefetch: bigPrefetch,
    modulePrefetch: consumer.prefetch,
    inFlight: settings.inFlight,
    readAhead: settings.readAhead ?? 'default (4)',
    consumerEnv: settings.consumerEnv,
    modulePhasesMs: phasesOf(b),
    cpuSeconds: cpuSummary([b]),
    moduleRedisCalls: redisCallsOf(b.trace),
    moduleRedisServerMs: b.redisServerMs,
  });
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
  Logger.overrideLogger(new StderrLogger('producer', { logLevels: ['error', 'warn'] }));
  progress(
    `run ${runId}: ${cpus().length} cores, node ${process.version}; ${settings.totalBytes / MiB} MiB in ` +
      `${settings.fragmentsMiB.join(', ')} MiB fragments, ${settings.rounds} rounds + 1 warm-up; ` +
      `prefetch ${settings.prefetch}, inFlight ${settings.inFlight}`,
  );

  const build = buildPlainJs(root);
  onCleanup('remove the plain-JS build', () => rmSync(build.dir, { recursive: true, force: true }));

  const redis = new Redis(settings.redisUrl);
  onCleanup('close the Redis admin client', async () => {
    await redis.quit().catch(() => redis.disconnect());
  });
  onCleanup(`delete Redis keys ${redisPrefix}:*`, async () => {
    let cursor = '0';
    let deleted = 0;
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${redisPrefix}:*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) deleted += await redis.unlink(...keys);
    } while (cursor !== '0');
    progress(`deleted ${deleted} Redis key(s) under ${redisPrefix}:`);
  });
  await checkRedis(redis);

  const connection = await amqp.connect(settings.amqpUrl);
  connection.on('error', (error: Error) => progress(`amqplib connection: ${error.message}`));
  onCleanup('close the amqplib connection', async () => {
    await connection.close().catch(() => undefined);
  });
  onCleanup('delete the queues', async () => {
    // A fresh channel: the ones in use may have been closed by an error.
    const channel = await connection.createChannel();
    for (const queue of queues) await channel.deleteQueue(queue);
    await channel.close();
    if (queues.size > 0) progress(`deleted ${queues.size} queue(s) ${queuePrefix}.*`);
  });
  const admin = await connection.createChannel();
  const raw = await connection.createConfirmChannel();
  for (const channel of [admin, raw]) {
    // A channel the broker closes fails its pending calls; without a listener it would also throw.
    channel.on('error', (error: Error) => progress(`amqplib channel: ${error.message}`));
  }

  const payload = randomBytes(settings.totalBytes);
  for (const unsafeSocketTricks of settings.socketTricks) {
    const producer = await startProducer(unsafeSocketTricks);
    const servers: Servers = {
      admin,
      raw,
      redis,
      splitter: producer.splitter,
      build,
      bench: new Bench(redis, settings.runTimeoutMs),
      unsafeSocketTricks,
    };
    for (const fragmentMiB of settings.fragmentsMiB) await runCase(servers, payload, fragmentMiB);
    if (settings.big) await runBigCase(servers);
    await producer.close();
  }
}

/** The producer's app (SplitterService over a transport of its own); `close()` is idempotent. */
async function startProducer(
  unsafeSocketTricks: boolean,
): Promise<{ splitter: SplitterService; close(): Promise<void> }> {
  const transport = await RabbitMqTransport.connect(settings.amqpUrl, { unsafeSocketTricks });
  onCleanup('close the producer transport', () => transport.close());
  @Module({
    imports: [
      SequenceModule.forRoot({
        transport,
        publish: { inFlight: settings.inFlight },
        sweepIntervalMs: false, // the producer consumes nothing
      }),
    ],
  })
  class ProducerModule {}
  const app: INestApplicationContext = await NestFactory.createApplicationContext(ProducerModule, {
    logger: new StderrLogger('producer', { logLevels: ['error', 'warn'] }),
  });
  let closing: Promise<void> | undefined;
  const close = () => (closing ??= app.close());
  onCleanup('close the producer app', close);
  return {
    splitter: app.get(SplitterService),
    close: async () => {
      await close();
      await transport.close();
    },
  };
}

function exitAfterCleanup(code: number): void {
  void cleanUp().then((clean) => process.exit(code !== 0 ? code : clean ? 0 : 1));
}

process.once('SIGINT', () => {
  progress('interrupted; cleaning up');
  exitAfterCleanup(130);
});
process.once('SIGTERM', () => {
  progress('terminated; cleaning up');
  exitAfterCleanup(143);
});

main().then(
  () => exitAfterCleanup(0),
  (error: unknown) => {
    console.error(error);
    exitAfterCleanup(1);
  },
);
