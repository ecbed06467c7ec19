/**
 * Transactional Outbox: SequenceModule's relay (PostgresOutboxStore + RabbitMqTransport) against
 * plain amqplib publishing of the same messages, and against pg-transactional-outbox in its
 * polling mode, in the same run, on the same servers.
 *
 *   npm run bench:outbox
 *
 * Workload: events whose JSON, as the module relays it, is 1 KB (`BENCH_OUTBOX_BODY_BYTES`), each
 * committed in a transaction of its own. Every path publishes persistent messages to a fresh
 * durable classic queue declared with the arguments RabbitMqTransport uses, with confirms.
 * Throughput paths (`BENCH_OUTBOX_EVENTS` = 20,000 events each, except pto):
 * (raw)       amqplib ConfirmChannel publishing the events with at most `BENCH_OUTBOX_BATCH`
 *             unconfirmed at once: the relay's batch size (library default 100), which is how many
 *             publishes its relay has in flight. Clock: first publish to last confirm.
 * (pg)        no outbox and no broker: the writers below run BEGIN; INSERT of a 1 KB row into a
 *             plain table; COMMIT. PostgreSQL's commit rate here: the ceiling of the live paths.
 * (module)    one Nest app: SequenceModule, PostgresOutboxStore (a table prefix of its own, its
 *             default pool of `BENCH_OUTBOX_POOL` = 10), RabbitMqTransport, relay on (defaults but
 *             `batchSize`). `BENCH_OUTBOX_WRITERS` (16) writers call `OutboxService.transaction`
 *             (one `publishEvent` each) while the relay runs, sharing the store's pool with it, as
 *             an app does. Clock: the first commit's start until the queue holds every event (its
 *             message count, polled every 10 ms, 1/1000 of the elapsed time when that is longer).
 * (relay)     relay only: the events committed by an app whose relay is off (100 per transaction,
 *             untimed: the relay finds the same records, one per event), then an app with the relay
 *             on (compiled beforehand) is initialized; clock: init until the queue holds every
 *             event. This isolates the relay from PostgreSQL's commit rate.
 * (pto)       pg-transactional-outbox, as (module): its message storage in the writers'
 *             transactions (a pool of the same size), its polling listener relaying (set up per its
 *             README, defaults: batch 5, polling every 500 ms; see outbox.pto.ts).
 * (pto-relay) as (relay), for pg-transactional-outbox: its listener started after the commits.
 * pto runs `BENCH_OUTBOX_PTO_EVENTS` (1,000) events: it relays an order of magnitude slower, so
 * 20,000 would take minutes per round, and its polling sorts every unprocessed row, so a shorter
 * backlog flatters it. After each module / pto path every record must be settled (COMPLETED /
 * processed) and the queue hold exactly the events (none twice), or the run fails.
 *
 * Rounds: one warm-up round (`BENCH_OUTBOX_WARMUP_EVENTS` = 1,000 events, pto its share of that),
 * discarded, then `BENCH_OUTBOX_ROUNDS` (3) rounds, the paths in the order above and in reverse,
 * alternately. One JSON line: messages/s of each path (median over rounds), the median of the
 * per-round ratios to raw publish (messages/s of the path / of raw in the same round), module /
 * pto, the writers' commits/s during the live paths, CPU ms per 1,000 messages of this process,
 * RabbitMQ and PostgreSQL (all its processes) and of the whole machine (other tenants included;
 * RabbitMQ's includes the queue polling), and where the module's relay spent its time
 * (outbox.traced-store.ts: lock, publish, settle per claim).
 *
 * Latency (one run each, after the rounds; a second JSON line): commits started on a fixed
 * schedule, `BENCH_OUTBOX_RATE` (500) per second for `BENCH_OUTBOX_SECONDS` (10), each commit time
 * taken when its commit resolved, each arrival time by a consumer (noAck) in this process; latency
 * = arrival − commit, p50 / p90 / p99 / max ms, and the commit rate achieved (when PostgreSQL
 * cannot commit at the offered rate, commits queue for the pool; the schedule is not slowed).
 * - raw: the same commits on a plain table, each followed at once by its publish (a dual write):
 *   the floor the machine sets; `p99ToRaw` divides each module p99 by its p99;
 * - module "notify": writers in an app whose relay is off, the relay in another app with its own
 *   pool, so only PostgreSQL's NOTIFY wakes it (poll interval left at 5 s), as with writers on
 *   other instances; module "same-app": writers and relay in one app (in-process wake-ups too);
 * - pto at the same rate for `BENCH_OUTBOX_PTO_LATENCY_SECONDS` (2; it falls behind, the backlog
 *   has to drain), and at `BENCH_OUTBOX_PTO_RATE` (50) per second, a rate it keeps up with, for
 *   `BENCH_OUTBOX_SECONDS`.
 *
 * Environment, besides the above: AMQP_URL, DATABASE_URL [postgres://postgres:postgres@
 * 127.0.0.1:5432/test], BENCH_OUTBOX_ONLY [all; comma-separated: raw, pg, module, relay, pto,
 * pto-relay, latency], BENCH_OUTBOX_PTO_BATCH [5], BENCH_OUTBOX_PTO_POLL_MS [500],
 * BENCH_TRACING [0; 1 registers an OpenTelemetry SDK in this process: harness/tracing.ts],
 * BENCH_OUTBOX_TRACE [1; 0 gives the module its store without the timing wrapper],
 * BENCH_UNSAFE_SOCKET_TRICKS [off; on, or both: every path without, then every path with; the
 * module's transport's `unsafeSocketTricks`, echoed as `unsafeSocketTricks` in each JSON line].
 * BENCH_TS_NODE [off: everything runs in a second process, this file's plain-JavaScript build
 * (harness/plain-js-run.ts); on: in this ts-node process], BENCH_CPU_PROF_DIR [unset; when set, that
 * plain-JavaScript process runs with --cpu-prof into that directory]. Progress goes to stderr. Tables
 * (`nseq_bench_ob_<run>_*`), schemas (`nseq_bench_pto_<run>_*`)
 * and queues (`nseq-bench-ob.<run>.*`) are unique to the run, removed after each path and swept
 * at the end, also after a failure or Ctrl-C (harness/cleanup.ts); any failure exits non-zero.
 * Each line has the harness's envelope: `case` (`throughput`, `latency`), `variant` (`default`,
 * `socket-tricks`), `ratio` (throughput: the relay's, `ratioToRaw.moduleRelayOnly`; latency:
 * null) and `at`.
 */
import { Logger } from '@nestjs/common';
import type * as amqp from 'amqplib';
import { Pool } from 'pg';
import { onCleanup } from './harness/cleanup';
import { runBenchAsPlainJs } from './harness/plain-js-run';
import { progress } from './harness/log';
import { nestLogger } from './harness/nest-logger';
import { report, round2, variantOf } from './harness/report';
import { connectAmqp } from './harness/resources';
import { roundsOf } from './harness/rounds';
import { socketTrickVariants } from './harness/settings';
import { DEFAULT_RELAY_CONCURRENCY } from './outbox.internals';
import { moduleLatency, moduleLive, moduleRelayOnly, type ModuleTimed } from './outbox.module';
import { ptoLatency, ptoLive, ptoRelayOnly } from './outbox.pto';
import { rawCommits, rawLatency, rawPublish, type Timed } from './outbox.raw';
import {
  makeEvents,
  PTO_SCHEMA_PREFIX,
  RUN_PREFIX,
  settings,
  type BenchEvent,
} from './outbox.settings';
import { ORDER, rateOf, summarize, type Round, type ThroughputPath } from './outbox.summary';
import { registerBenchTracing } from './harness/tracing';

registerBenchTracing();

function measure(
  path: ThroughputPath,
  connection: amqp.ChannelModel,
  events: readonly BenchEvent[],
  unsafeSocketTricks: boolean,
): Promise<Timed | ModuleTimed> {
  switch (path) {
    case 'raw':
      return rawPublish(connection, events);
    case 'pg':
      return rawCommits(events);
    case 'module':
      return moduleLive(connection, events, unsafeSocketTricks);
    case 'relay':
      return moduleRelayOnly(connection, events, unsafeSocketTricks);
    case 'pto':
      return ptoLive(connection, events);
    case 'pto-relay':
      return ptoRelayOnly(connection, events);
  }
}

function describe(path: ThroughputPath, result: Timed | ModuleTimed): string {
  const parts = [
    `${path}: ${Math.round(rateOf(result))} msg/s (${result.messages} in ${result.seconds.toFixed(2)} s)`,
  ];
  if ('commitSeconds' in result && result.commitSeconds) {
    parts.push(`writers ${Math.round(result.messages / result.commitSeconds)} commits/s`);
  }
  if ('relay' in result && result.relay) parts.push(`relay ${JSON.stringify(result.relay)}`);
  parts.push(`CPU ms/1k ${JSON.stringify(result.cpu)}`);
  if (result.pgStats) parts.push(`PostgreSQL per 1k ${JSON.stringify(result.pgStats)}`);
  return parts.join(', ');
}

async function runRound(
  connection: amqp.ChannelModel,
  events: readonly BenchEvent[],
  ptoEvents: number,
  label: string,
  reverse: boolean,
  unsafeSocketTricks: boolean,
): Promise<Round> {
  const round: Round = {};
  for (const path of reverse ? [...ORDER].reverse() : ORDER) {
    if (!settings.only.has(path)) continue;
    const some = path.startsWith('pto') ? events.slice(0, ptoEvents) : events;
    const result = await measure(path, connection, some, unsafeSocketTricks);
    round[path] = result;
    progress(`${label} ${describe(path, result)}`);
  }
  return round;
}

/** Drops every table and schema of this run (also after a failure or Ctrl-C). */
async function dropRunTables(): Promise<void> {
  const pool = new Pool({ connectionString: settings.databaseUrl, max: 1 });
  pool.on('error', () => undefined);
  try {
    const tables = await pool.query<{ name: string }>(
      `SELECT tablename AS name FROM pg_tables WHERE schemaname = 'public' AND tablename LIKE $1`,
      [`${RUN_PREFIX}%`],
    );
    for (const { name } of tables.rows) await pool.query(`DROP TABLE IF EXISTS ${name} CASCADE`);
    const schemas = await pool.query<{ name: string }>(
      `SELECT nspname AS name FROM pg_namespace WHERE nspname LIKE $1`,
      [`${PTO_SCHEMA_PREFIX}%`],
    );
    for (const { name } of schemas.rows) await pool.query(`DROP SCHEMA IF EXISTS ${name} CASCADE`);
    const dropped = tables.rows.length + schemas.rows.length;
    if (dropped > 0) progress(`dropped ${dropped} table(s) and schema(s) of run ${RUN_PREFIX}`);
  } finally {
    await pool.end();
  }
}

async function main(): Promise<void> {
  // stdout carries the JSON lines only: Nest's LOG lines (e.g. AmqpConnection's) are not wanted.
  Logger.overrideLogger(nestLogger('outbox'));
  // Registered first, so that it runs last: once the apps, pools and listeners are closed.
  onCleanup(`drop the tables and schemas of run ${RUN_PREFIX}`, dropRunTables);
  const connection = await connectAmqp(settings.amqpUrl);
  for (const unsafeSocketTricks of socketTrickVariants()) {
    await runVariant(connection, unsafeSocketTricks);
  }
}

/** Every path and the latency runs, the module's with `unsafeSocketTricks` as given. */
async function runVariant(
  connection: amqp.ChannelModel,
  unsafeSocketTricks: boolean,
): Promise<void> {
  const runStarted = Date.now();
  const elapsedSeconds = () => Math.round((Date.now() - runStarted) / 1000);
  const events = makeEvents(settings.events);
  progress(
    `run ${RUN_PREFIX}: ${settings.events} events, ${settings.rounds} rounds, ` +
      `unsafeSocketTricks ${unsafeSocketTricks}`,
  );
  const rounds: Round[] = [];
  for (const round of roundsOf({ rounds: settings.rounds, warmUp: true, alternate: true })) {
    // Odd rounds in ORDER, even ones reversed; the warm-up in ORDER.
    const reverse = !round.warmUp && !round.baselineFirst;
    if (round.warmUp) {
      // The warm-up is a scaled-down round: pg-transactional-outbox gets its share of it.
      const warmup = events.slice(0, settings.warmupEvents);
      const ptoWarmup = Math.min(
        settings.ptoEvents,
        Math.max(100, Math.round((settings.warmupEvents * settings.ptoEvents) / settings.events)),
      );
      await runRound(connection, warmup, ptoWarmup, round.label, reverse, unsafeSocketTricks);
      continue;
    }
    rounds.push(
      await runRound(
        connection,
        events,
        settings.ptoEvents,
        round.label,
        reverse,
        unsafeSocketTricks,
      ),
    );
  }
  if (rounds.some((round) => Object.keys(round).length > 0)) {
    const summary = summarize(rounds);
    report(
      {
        bench: 'outbox',
        case: 'throughput',
        variant: variantOf(unsafeSocketTricks),
        ratio: summary.ratioToRaw.moduleRelayOnly ?? null,
      },
      {
        unsafeSocketTricks,
        events: settings.events,
        ptoEvents: settings.ptoEvents,
        bodyBytes: settings.bodyBytes,
        rounds: settings.rounds,
        writers: settings.writers,
        poolSize: settings.poolSize,
        batchSize: settings.batchSize,
        relayConcurrency: settings.relayConcurrency ?? `default (${DEFAULT_RELAY_CONCURRENCY})`,
        retentionMs: settings.retentionMs ?? 'default',
        pto: { batchSize: settings.ptoBatchSize, pollIntervalMs: settings.ptoPollMs },
        ...summary,
        target: { ratioToRaw: 0.7 },
        elapsedSeconds: elapsedSeconds(),
      },
    );
  }
  if (settings.only.has('latency')) {
    const latencyEvents = makeEvents(settings.rate * settings.seconds);
    const raw = await rawLatency(connection, latencyEvents);
    progress(`latency raw (commit, then publish): ${JSON.stringify(raw)}`);
    const moduleNotify = await moduleLatency(
      connection,
      latencyEvents,
      'notify',
      unsafeSocketTricks,
    );
    progress(`latency module (NOTIFY only): ${JSON.stringify(moduleNotify)}`);
    const moduleSameApp = await moduleLatency(
      connection,
      latencyEvents,
      'same-app',
      unsafeSocketTricks,
    );
    progress(`latency module (same app): ${JSON.stringify(moduleSameApp)}`);
    const ptoEvents = latencyEvents.slice(0, settings.rate * settings.ptoLatencySeconds);
    const pto = await ptoLatency(connection, ptoEvents, settings.rate);
    progress(`latency pto at ${settings.rate}/s: ${JSON.stringify(pto)}`);
    const sustained = settings.ptoSustainedRate;
    const ptoSlow = await ptoLatency(
      connection,
      latencyEvents.slice(0, sustained * settings.seconds),
      sustained,
    );
    progress(`latency pto at ${sustained}/s: ${JSON.stringify(ptoSlow)}`);
    report(
      {
        bench: 'outbox-latency',
        case: 'latency',
        variant: variantOf(unsafeSocketTricks),
        ratio: null,
      },
      {
        unsafeSocketTricks,
        ratePerSecond: settings.rate,
        seconds: settings.seconds,
        raw,
        moduleNotify,
        moduleSameApp,
        p99ToRaw: {
          moduleNotify: round2(moduleNotify.p99Ms / raw.p99Ms),
          moduleSameApp: round2(moduleSameApp.p99Ms / raw.p99Ms),
        },
        pto: { ...pto, seconds: settings.ptoLatencySeconds },
        ptoSustained: { ...ptoSlow, seconds: settings.seconds },
        target: { moduleNotifyP99Ms: 100 },
        elapsedSeconds: elapsedSeconds(),
      },
    );
  }
}

runBenchAsPlainJs('outbox', __filename, main);
