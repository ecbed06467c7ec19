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
 * transport's and the store's `unsafeSocketTricks`]. Queues and Redis keys are unique to the run
 * and removed at the end.
 */
import { randomUUID } from 'node:crypto';
import { Test } from '@nestjs/testing';
import * as amqp from 'amqplib';
import { Redis } from 'ioredis';
import { MemoryResequencerStore, ResequencerService, SequenceModule } from 'nest-sequence';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { median, report, socketTrickVariants } from './bench.util';
import { busiestProcessNamed, cpuSecondsOf, ownCpuSeconds } from './process-probe';

function positive(name: string, fallback: number): number {
  const value = Number(process.env[name] ?? fallback);
  if (!Number.isSafeInteger(value) || value <= 0) throw new Error(`${name} must be > 0`);
  return value;
}

const settings = {
  amqpUrl: process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672',
  redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
  events: positive('BENCH_RSQ_EVENTS', 100_000),
  keys: positive('BENCH_RSQ_KEYS', 1_000),
  window: positive('BENCH_RSQ_WINDOW', 5_000),
  prefetch: positive('BENCH_RSQ_PREFETCH', 64),
  rounds: positive('BENCH_RSQ_ROUNDS', 3),
  outputInFlight: positive('BENCH_RSQ_IN_FLIGHT', 1),
  store: storeKind(process.env.BENCH_RSQ_STORE ?? 'redis'),
};

function storeKind(value: string): 'redis' | 'memory' {
  if (value !== 'redis' && value !== 'memory') {
    throw new Error(`BENCH_RSQ_STORE must be redis or memory, got ${value}`);
  }
  return value;
}
const perKey = Math.ceil(settings.events / settings.keys);
const runId = randomUUID().slice(0, 8);
const progress = (line: string) => process.stderr.write(`${line}\n`);

const servers = {
  rabbitmq: busiestProcessNamed('beam.smp'),
  redis: busiestProcessNamed('redis-server'),
};

/** CPU seconds used so far by this process, RabbitMQ and Redis (undefined where unknown). */
function cpuNow() {
  return {
    node: ownCpuSeconds(),
    rabbitmq: cpuSecondsOf(servers.rabbitmq),
    redis: cpuSecondsOf(servers.redis),
  };
}

type CpuReading = ReturnType<typeof cpuNow>;

/** CPU milliseconds per 1,000 events between two readings, per process. */
function cpuPerThousand(from: CpuReading, to: CpuReading, events: number) {
  const per = (a?: number, b?: number) =>
    a === undefined || b === undefined ? undefined : Math.round(((b - a) * 1e6) / events);
  return {
    node: per(from.node, to.node),
    rabbitmq: per(from.rabbitmq, to.rabbitmq),
    redis: per(from.redis, to.redis),
  };
}

interface BenchEvent {
  readonly key: string;
  readonly seq: number;
  readonly body: Buffer;
}

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

const headersOf = (event: BenchEvent) => ({
  'x-resequence-key': event.key,
  'x-resequence-seq': event.seq,
});

/**
 * Resolves when `queue` holds `count` messages. A queue not declared yet (the transport declares
 * the output on its first publish) counts as empty: checkQueue then closes its channel, so each
 * look uses a channel of its own.
 */
async function waitForCount(
  connection: amqp.ChannelModel,
  queue: string,
  count: number,
): Promise<void> {
  const channel = await connection.createChannel();
  channel.on('error', () => undefined);
  let current = channel;
  for (;;) {
    try {
      const { messageCount } = await current.checkQueue(queue);
      if (messageCount >= count) break;
    } catch {
      current = await connection.createChannel();
      current.on('error', () => undefined);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  await current.close();
}

async function baselineRound(connection: amqp.ChannelModel, events: BenchEvent[]) {
  const input = `nseq-bench-rsq.${runId}.base-in.${randomUUID().slice(0, 6)}`;
  const output = `${input}.out`;
  const admin = await connection.createConfirmChannel();
  await admin.assertQueue(input, { durable: true });
  await admin.assertQueue(output, { durable: true });
  for (const event of events) {
    admin.sendToQueue(input, event.body, { persistent: true, headers: headersOf(event) });
  }
  await admin.waitForConfirms();

  const consumer = await connection.createChannel();
  const publisher = await connection.createConfirmChannel();
  await consumer.prefetch(settings.prefetch);
  const cpuBefore = cpuNow();
  const started = process.hrtime.bigint();
  await consumer.consume(input, (message) => {
    if (!message) return;
    publisher.sendToQueue(
      output,
      message.content,
      { persistent: true, headers: message.properties.headers },
      (error) => (error ? consumer.nack(message, false, true) : consumer.ack(message)),
    );
  });
  await waitForCount(connection, output, events.length);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  const cpu = cpuPerThousand(cpuBefore, cpuNow(), events.length);
  await consumer.close();
  await publisher.close();
  await admin.deleteQueue(input);
  await admin.deleteQueue(output);
  await admin.close();
  return { seconds, cpu };
}

async function moduleRound(
  connection: amqp.ChannelModel,
  redis: Redis,
  events: BenchEvent[],
  unsafeSocketTricks: boolean,
) {
  const input = `nseq-bench-rsq.${runId}.mod-in.${randomUUID().slice(0, 6)}`;
  const output = `${input}.out`;
  const prefix = `nseq-bench-rsq:${runId}:${randomUUID().slice(0, 6)}`;
  const transport = await RabbitMqTransport.connect(settings.amqpUrl, {
    prefetch: settings.prefetch,
    unsafeSocketTricks,
  });
  const store =
    settings.store === 'memory'
      ? new MemoryResequencerStore()
      : new RedisResequencerStore(redis, { prefix, unsafeSocketTricks });
  for (let i = 0; i < events.length; i += 500) {
    await Promise.all(
      events
        .slice(i, i + 500)
        .map((event) => transport.publish(input, event.body, headersOf(event))),
    );
  }
  const moduleRef = await Test.createTestingModule({
    imports: [
      SequenceModule.forRoot({
        transport,
        metrics: false,
        resequencer: { store, maxBufferedTotal: settings.events },
        tuning: { sweepers: { gaps: { intervalMs: false } } },
      }),
    ],
  }).compile();
  const app = await moduleRef.init();
  const resequencer = app.get(ResequencerService).create({
    channel: input,
    output,
    outputInFlight: settings.outputInFlight,
    gap: { timeoutMs: 600_000, policy: 'alert' },
  });

  let maxBuffered = 0;
  const sampler = setInterval(() => {
    void store.bufferedTotal(input).then((count) => (maxBuffered = Math.max(maxBuffered, count)));
  }, 20);
  const cpuBefore = cpuNow();
  const started = process.hrtime.bigint();
  const subscription = await transport.subscribe(input, (message) => resequencer.receive(message), {
    prefetch: settings.prefetch,
  });
  await waitForCount(connection, output, events.length);
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  const cpu = cpuPerThousand(cpuBefore, cpuNow(), events.length);
  clearInterval(sampler);
  await subscription.close();

  const check = await connection.createChannel();
  await verifyOrder(check, output, events.length);
  await check.deleteQueue(output);
  await check.deleteQueue(input);
  await check.deleteQueue(`${input}.dlq`).catch(() => undefined);
  await check.deleteQueue(`${output}.dlq`).catch(() => undefined);
  await check.close();
  await app.close();
  await transport.close();
  await deleteUnder(redis, prefix);
  return { seconds, maxBuffered, cpu };
}

/** Reads the output back: per key exactly 1..n, in order. */
async function verifyOrder(channel: amqp.Channel, queue: string, count: number): Promise<void> {
  const next = new Map<string, number>();
  for (let read = 0; read < count; read++) {
    const message = await channel.get(queue, { noAck: true });
    if (!message) throw new Error(`output has ${read} messages, expected ${count}`);
    const key = String(message.properties.headers?.['x-resequence-key']);
    const seq = Number(message.properties.headers?.['x-resequence-seq']);
    const expected = next.get(key) ?? 1;
    if (seq !== expected) throw new Error(`key ${key}: got ${seq} where ${expected} was due`);
    next.set(key, seq + 1);
  }
  if (await channel.get(queue, { noAck: true })) throw new Error('output holds extra messages');
}

async function deleteUnder(redis: Redis, prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [nextCursor, keys] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
    if (keys.length > 0) await redis.del(...keys);
    cursor = nextCursor;
  } while (cursor !== '0');
}

type CpuPerThousand = ReturnType<typeof cpuPerThousand>;

function medianCpu(readings: CpuPerThousand[]) {
  const of = (name: keyof CpuPerThousand) => {
    const values = readings.map((reading) => reading[name]).filter((v) => v !== undefined);
    return values.length > 0 ? median(values) : undefined;
  };
  return { node: of('node'), rabbitmq: of('rabbitmq'), redis: of('redis') };
}

async function main(): Promise<void> {
  for (const unsafeSocketTricks of socketTrickVariants()) await runVariant(unsafeSocketTricks);
}

/** Every round of both paths, the module's with `unsafeSocketTricks` as given; one JSON line. */
async function runVariant(unsafeSocketTricks: boolean): Promise<void> {
  const events = makeEvents();
  const connection = await amqp.connect(settings.amqpUrl);
  const redis = new Redis(settings.redisUrl);
  const baseline: number[] = [];
  const module: number[] = [];
  const ratios: number[] = [];
  let maxBuffered = 0;
  const cpu = { baseline: [] as CpuPerThousand[], module: [] as CpuPerThousand[] };
  try {
    for (let round = 1; round <= settings.rounds; round++) {
      const order = round % 2 === 1 ? ['a', 'b'] : ['b', 'a'];
      let a = 0;
      let b = 0;
      for (const path of order) {
        if (process.env.BENCH_RSQ_ONLY && process.env.BENCH_RSQ_ONLY !== path) continue;
        if (path === 'a') {
          const result = await baselineRound(connection, events);
          a = result.seconds;
          cpu.baseline.push(result.cpu);
          progress(
            `round ${round} baseline: ${(events.length / a).toFixed(0)} events/s, ` +
              `CPU ms per 1,000 events ${JSON.stringify(result.cpu)}`,
          );
        } else {
          const result = await moduleRound(connection, redis, events, unsafeSocketTricks);
          b = result.seconds;
          maxBuffered = Math.max(maxBuffered, result.maxBuffered);
          cpu.module.push(result.cpu);
          progress(
            `round ${round} module (unsafeSocketTricks ${unsafeSocketTricks}): ` +
              `${(events.length / b).toFixed(0)} events/s, ` +
              `max buffered ${result.maxBuffered}, CPU ms per 1,000 events ${JSON.stringify(result.cpu)}`,
          );
        }
      }
      baseline.push(events.length / a);
      module.push(events.length / b);
      ratios.push(a / b);
    }
  } finally {
    await connection.close();
    await redis.quit();
  }
  report({
    bench: 'resequencer',
    events: events.length,
    keys: settings.keys,
    window: settings.window,
    prefetch: settings.prefetch,
    rounds: settings.rounds,
    outputInFlight: settings.outputInFlight,
    store: settings.store,
    unsafeSocketTricks,
    baselineEventsPerSecond: Math.round(median(baseline)),
    moduleEventsPerSecond: Math.round(median(module)),
    ratio: Math.round(median(ratios) * 100) / 100,
    ratios: ratios.map((ratio) => Math.round(ratio * 100) / 100),
    maxBuffered,
    cpuMsPerThousandEvents: { baseline: medianCpu(cpu.baseline), module: medianCpu(cpu.module) },
  });
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
