/**
 * Resequencer over RabbitMQ and Redis, against a plain amqplib pass-through of the same events,
 * in the same run, on the same servers.
 *
 *   npm run bench:resequencer
 *
 * Events: `BENCH_RSQ_EVENTS` (100,000) over `BENCH_RSQ_KEYS` (1,000) keys, sequences 1..n per key,
 * sent round-robin over the keys and then shuffled within windows of `BENCH_RSQ_WINDOW` events
 * (so each key's events arrive out of order, as from parallel upstream services). Each round
 * pre-loads its input queue (untimed), then times the consumer from its subscription until the
 * output queue holds every event:
 * (a) baseline: amqplib consumes the input (prefetch `BENCH_RSQ_PREFETCH`), publishes each message
 *     to the output queue on a confirm channel, and acks the input once the broker confirmed;
 * (b) module: RabbitMqTransport consumes the input with the same prefetch and hands each message to
 *     a Resequencer (`ResequencerService.create`, RedisResequencerStore, `output` channel): it is
 *     accepted in Redis (one Lua step), buffered or released, and released events are published
 *     in order per key with confirms before the input is acked.
 * The clock stops when the output queue's message count reaches the number of events (polled
 * every 20 ms in both paths). After each module round the output is read back and checked: per key
 * exactly 1..n, in order. One JSON line: events/s of each path (median of `BENCH_RSQ_ROUNDS`
 * rounds, alternating a b / b a), the median of the per-round ratios b/a, and the largest number
 * of events the resequencer held buffered at once (sampled every 20 ms), and the CPU milliseconds
 * per 1,000 events this process, RabbitMQ and Redis spent during the timed part of each path.
 *
 * Environment: AMQP_URL, REDIS_URL, BENCH_RSQ_EVENTS, BENCH_RSQ_KEYS, BENCH_RSQ_WINDOW,
 * BENCH_RSQ_PREFETCH [64], BENCH_RSQ_ROUNDS [3], BENCH_RSQ_ONLY [unset; `a` or `b` runs one path,
 * for profiling], BENCH_RSQ_IN_FLIGHT [1: the resequencer's `outputInFlight`], BENCH_RSQ_STORE
 * [`redis`; `memory`: a MemoryResequencerStore, one process only, for comparison],
 * BENCH_UNSAFE_SOCKET_TRICKS [`off`; `on`, or `both` for a line without then one with: the
 * transport's and the store's `unsafeSocketTricks`], BENCH_TS_NODE [off: both paths run in a
 * second process, this file's plain-JavaScript build (harness/plain-js-run.ts); on: in this
 * ts-node process], BENCH_CPU_PROF_DIR [unset; when set, the plain-JavaScript process runs with
 * --cpu-prof into that directory]. Queues and Redis keys are unique to the run
 * and removed after each round, and at the latest at the end, also on failure or Ctrl-C
 * (harness/cleanup.ts). The line has the harness's envelope: `case` (`<events>-events`),
 * `variant` (`default`, `socket-tricks`) and `at`.
 */
import { Logger } from '@nestjs/common';
import { runBenchAsPlainJs } from './harness/plain-js-run';
import { CpuMeter } from './harness/cpu';
import { progress } from './harness/log';
import { nestLogger } from './harness/nest-logger';
import { median, report, round2, variantOf } from './harness/report';
import {
  connectAmqp,
  connectRedis,
  deleteKeysWhenDone,
  newRunId,
  QueueJanitor,
} from './harness/resources';
import { roundsOf } from './harness/rounds';
import {
  choiceSetting,
  positiveInteger,
  readSettings,
  servers,
  socketTrickVariants,
  textSetting,
} from './harness/settings';
import {
  baselineRound,
  moduleRound,
  type BenchEvent,
  type CpuPerThousand,
  type PathContext,
} from './resequencer.paths';

const settings = readSettings(() => ({
  amqpUrl: servers.amqpUrl,
  redisUrl: servers.redisUrl,
  events: positiveInteger('BENCH_RSQ_EVENTS', 100_000),
  keys: positiveInteger('BENCH_RSQ_KEYS', 1_000),
  window: positiveInteger('BENCH_RSQ_WINDOW', 5_000),
  prefetch: positiveInteger('BENCH_RSQ_PREFETCH', 64),
  rounds: positiveInteger('BENCH_RSQ_ROUNDS', 3),
  outputInFlight: positiveInteger('BENCH_RSQ_IN_FLIGHT', 1),
  store: choiceSetting('BENCH_RSQ_STORE', ['redis', 'memory'], 'redis'),
  /** One path only (`a` or `b`), for profiling; both when unset. */
  only:
    textSetting('BENCH_RSQ_ONLY') === undefined
      ? undefined
      : choiceSetting('BENCH_RSQ_ONLY', ['a', 'b'], 'a'),
  socketTricks: socketTrickVariants(),
}));
const perKey = Math.ceil(settings.events / settings.keys);
const runId = newRunId();

/** Round-robin over keys, then a deterministic shuffle inside each window. */
function makeEvents(): BenchEvent[] {
  const events: BenchEvent[] = [];
  for (let seq = 1; seq <= perKey; seq++) {
    for (let k = 0; k < settings.keys && events.length < settings.events; k++) {
      const key = `transfer-${k}`;
      const body = Buffer.from(JSON.stringify({ transfer: key, seq, status: `status-${seq}` }));
      events.push({ key, seq, body });
    }
  }
  let state = 0x2545f491;
  for (let start = 0; start < events.length; start += settings.window) {
    const end = Math.min(events.length, start + settings.window);
    for (let i = end - 1; i > start; i--) {
      state ^= state << 13;
      state ^= state >>> 17;
      state ^= state << 5;
      const j = start + ((state >>> 0) % (i - start + 1));
      [events[i], events[j]] = [events[j], events[i]];
    }
  }
  return events;
}

/** Field-wise median of the rounds' CPU readings (undefined where no round has a figure). */
function medianCpu(readings: CpuPerThousand[]) {
  const of = (name: keyof CpuPerThousand) => {
    const values = readings.map((reading) => reading[name]).filter((v) => v !== undefined);
    return values.length > 0 ? median(values) : undefined;
  };
  return { node: of('node'), rabbitmq: of('rabbitmq'), redis: of('redis') };
}

async function main(): Promise<void> {
  // stdout carries the JSON line only: AmqpConnection's LOG lines go to stderr, if at all.
  Logger.overrideLogger(nestLogger('resequencer'));
  const connection = await connectAmqp(settings.amqpUrl);
  const queuePrefix = `nseq-bench-rsq.${runId}`;
  const redisPrefix = `nseq-bench-rsq:${runId}`;
  deleteKeysWhenDone(settings.redisUrl, redisPrefix);
  const redis = connectRedis(settings.redisUrl);
  const context: PathContext = {
    amqpUrl: settings.amqpUrl,
    connection,
    queues: new QueueJanitor(settings.amqpUrl, `${queuePrefix}.*`),
    redis,
    cpu: new CpuMeter(['rabbitmq', 'redis']),
    queuePrefix,
    redisPrefix,
    prefetch: settings.prefetch,
    outputInFlight: settings.outputInFlight,
    store: settings.store,
  };
  for (const unsafeSocketTricks of settings.socketTricks) {
    await runVariant(context, unsafeSocketTricks);
  }
}

/** Every round of both paths, the module's with `unsafeSocketTricks` as given; one JSON line. */
async function runVariant(context: PathContext, unsafeSocketTricks: boolean): Promise<void> {
  const events = makeEvents();
  const baseline: number[] = [];
  const module: number[] = [];
  const ratios: number[] = [];
  let maxBuffered = 0;
  const cpu = { baseline: [] as CpuPerThousand[], module: [] as CpuPerThousand[] };
  for (const round of roundsOf({ rounds: settings.rounds, warmUp: false, alternate: true })) {
    let a: number | undefined;
    let b: number | undefined;
    for (const path of round.baselineFirst ? ['a', 'b'] : ['b', 'a']) {
      if (settings.only && settings.only !== path) continue;
      if (path === 'a') {
        const result = await baselineRound(context, events);
        a = result.seconds;
        cpu.baseline.push(result.cpu);
        progress(
          `${round.label} baseline: ${(events.length / a).toFixed(0)} events/s, ` +
            `CPU ms per 1,000 events ${JSON.stringify(result.cpu)}`,
        );
      } else {
        const result = await moduleRound(context, events, unsafeSocketTricks);
        b = result.seconds;
        maxBuffered = Math.max(maxBuffered, result.maxBuffered ?? 0);
        cpu.module.push(result.cpu);
        progress(
          `${round.label} module (unsafeSocketTricks ${unsafeSocketTricks}): ` +
            `${(events.length / b).toFixed(0)} events/s, ` +
            `max buffered ${result.maxBuffered}, CPU ms per 1,000 events ${JSON.stringify(result.cpu)}`,
        );
      }
    }
    if (a !== undefined) baseline.push(events.length / a);
    if (b !== undefined) module.push(events.length / b);
    if (a !== undefined && b !== undefined) ratios.push(a / b);
  }
  report(
    {
      bench: 'resequencer',
      case: `${events.length}-events`,
      variant: variantOf(unsafeSocketTricks),
      ratio: ratios.length > 0 ? round2(median(ratios)) : null,
    },
    {
      events: events.length,
      keys: settings.keys,
      window: settings.window,
      prefetch: settings.prefetch,
      rounds: settings.rounds,
      outputInFlight: settings.outputInFlight,
      store: settings.store,
      unsafeSocketTricks,
      baselineEventsPerSecond: baseline.length > 0 ? Math.round(median(baseline)) : null,
      moduleEventsPerSecond: module.length > 0 ? Math.round(median(module)) : null,
      ratios: ratios.map(round2),
      maxBuffered,
      cpuMsPerThousandEvents: { baseline: medianCpu(cpu.baseline), module: medianCpu(cpu.module) },
    },
  );
}

runBenchAsPlainJs('resequencer', __filename, main);
