/**
 * Settings, workload and small helpers of the Outbox benchmark (`bench/outbox.bench.ts`).
 */
import { randomUUID } from 'node:crypto';
import { newRunId } from './harness/resources';
import {
  nonNegativeNumber,
  optionalPositiveInteger,
  positiveInteger as positive,
  readSettings,
  servers,
  subsetSetting,
  switchSetting,
  textSetting,
} from './harness/settings';

/** The measurements `BENCH_OUTBOX_ONLY` can select (comma-separated); all when unset. */
export const PATHS = ['raw', 'pg', 'module', 'relay', 'pto', 'pto-relay', 'latency'] as const;
export type PathName = (typeof PATHS)[number];

export const settings = readSettings(() => {
  const events = positive('BENCH_OUTBOX_EVENTS', 20_000);
  return {
    amqpUrl: servers.amqpUrl,
    databaseUrl: servers.databaseUrl,
    events,
    /** The warm-up round is smaller: it only has to warm the JIT, the pools and the caches. */
    warmupEvents: Math.min(events, positive('BENCH_OUTBOX_WARMUP_EVENTS', 1_000)),
    /**
     * Events of the pg-transactional-outbox paths: it relays an order of magnitude slower (and
     * slower still with a longer backlog: its polling function sorts every unprocessed row), so
     * 20,000 would take minutes per round. Fewer events flatter it, if anything.
     */
    ptoEvents: Math.min(events, positive('BENCH_OUTBOX_PTO_EVENTS', 1_000)),
    rounds: positive('BENCH_OUTBOX_ROUNDS', 3),
    writers: positive('BENCH_OUTBOX_WRITERS', 16),
    /** Relay batch size; also the raw path's bound on unconfirmed messages. Library default. */
    batchSize: positive('BENCH_OUTBOX_BATCH', 100),
    /** Claims the relay runs at once; unset keeps the library's default (DEFAULTS.outbox.outboxes). */
    relayConcurrency: optionalPositiveInteger('BENCH_OUTBOX_CONCURRENCY'),
    /**
     * The module's `outboxEvents.retentionMs`; unset keeps the library's default. `0`: the relay
     * deletes what it published instead of marking it COMPLETED.
     */
    retentionMs:
      textSetting('BENCH_OUTBOX_RETENTION_MS') === undefined
        ? undefined
        : Math.floor(nonNegativeNumber('BENCH_OUTBOX_RETENTION_MS', 0)),
    /** Connections of each pool the benchmark's writers use (the module store's default). */
    poolSize: positive('BENCH_OUTBOX_POOL', 10),
    rate: positive('BENCH_OUTBOX_RATE', 500),
    seconds: positive('BENCH_OUTBOX_SECONDS', 10),
    /** pg-transactional-outbox polling: its defaults (README / generated .env). */
    ptoBatchSize: positive('BENCH_OUTBOX_PTO_BATCH', 5),
    ptoPollMs: positive('BENCH_OUTBOX_PTO_POLL_MS', 500),
    /** Its latency at `rate` is run this long only: it falls behind, and the backlog must drain. */
    ptoLatencySeconds: positive('BENCH_OUTBOX_PTO_LATENCY_SECONDS', 2),
    /** A rate it sustains, for its latency when it keeps up (its polling interval's cost). */
    ptoSustainedRate: positive('BENCH_OUTBOX_PTO_RATE', 50),
    bodyBytes: positive('BENCH_OUTBOX_BODY_BYTES', 1024),
    /** Relay phase timings through a forwarding store wrapper (a few clock reads per claim). */
    trace: switchSetting('BENCH_OUTBOX_TRACE', true),
    only: subsetSetting('BENCH_OUTBOX_ONLY', PATHS),
  };
});

/** Unique to this run: table prefixes, schemas and queues start with it. */
export const runId = newRunId();
export const RUN_PREFIX = `nseq_bench_ob_${runId}_`;
export const PTO_SCHEMA_PREFIX = `nseq_bench_pto_${runId}_`;

let serial = 0;
/** A fresh name part (`t1`, `t2`, ...) for one measurement's tables or queue. */
export function nextTag(): string {
  serial += 1;
  return `t${serial}`;
}

export const queueName = (tag: string) => `nseq-bench-ob.${runId}.${tag}`;

/** Events per transaction of the relay-only paths' backlog (committed before the clock). */
export const BACKLOG_BATCH = 100;

export const EVENT_TYPE = 'BenchEvent';
export const AGGREGATE_TYPE = 'Bench';

/** One event of the workload; the same ids and payloads go through every path. */
export interface BenchEvent {
  readonly id: string;
  readonly aggregateId: string;
  readonly payload: { readonly data: string };
}

/**
 * `count` events whose JSON, as the module relays it (id, type, aggregateType, aggregateId,
 * payload, occurredAt), is `bodyBytes` long: the payload is padded to that size.
 */
export function makeEvents(count: number): BenchEvent[] {
  const sample = rawBody({
    id: randomUUID(),
    aggregateId: aggregateIdOf(0),
    payload: { data: '' },
  });
  const padding = Math.max(0, settings.bodyBytes - sample.length);
  return Array.from({ length: count }, (_, i) => ({
    id: randomUUID(),
    aggregateId: aggregateIdOf(i),
    payload: { data: String(i).padStart(padding, '.') },
  }));
}

function aggregateIdOf(i: number): string {
  return `agg-${String(i).padStart(8, '0')}`;
}

/** The body the module's relay publishes for `event` (same fields, same order, same size). */
export function rawBody(event: BenchEvent): Buffer {
  return Buffer.from(
    JSON.stringify({
      type: EVENT_TYPE,
      aggregateType: AGGREGATE_TYPE,
      aggregateId: event.aggregateId,
      payload: event.payload,
      id: event.id,
      occurredAt: new Date().toISOString(),
    }),
  );
}

/** The headers the module's relay sends with an event. */
export function rawHeaders(event: BenchEvent): Record<string, string> {
  return {
    'x-message-id': event.id,
    'x-message-kind': 'event',
    'x-message-type': EVENT_TYPE,
    'content-type': 'application/json',
  };
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Milliseconds since an arbitrary origin, monotonic (commit and receive times). */
export const nowMs = () => performance.now();

/**
 * Runs `commit(i)` for i = 0..count-1 on `writers` concurrent loops (each takes the next index
 * when its previous commit resolved). Resolves with the seconds from start to the last commit.
 */
export async function runWriters(
  count: number,
  writers: number,
  commit: (i: number) => Promise<void>,
): Promise<number> {
  let next = 0;
  const started = nowMs();
  await Promise.all(
    Array.from({ length: Math.min(writers, count) }, async () => {
      for (let i = next++; i < count; i = next++) await commit(i);
    }),
  );
  return (nowMs() - started) / 1000;
}

/** The p-th percentile (0..100) of `values`, nearest rank. */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))];
}
