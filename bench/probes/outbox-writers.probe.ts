/**
 * The live outbox path's writers without the relay: `bench:outbox`'s 16 writers committing one
 * event per `OutboxService.transaction` into a `PostgresOutboxStore` whose relay is off (`module`),
 * against the same writers' plain `BEGIN; INSERT; COMMIT` (`pg`, bench:outbox's commits-alone
 * path), alternated in one process over `BENCH_OUTBOX_ROUNDS` rounds after a warm-up round:
 *
 *   node -r ts-node/register/transpile-only -r tsconfig-paths/register \
 *     bench/probes/outbox-writers.probe.ts
 *
 * bench:outbox times the writers and the relay together; this probe tells the writers' share of
 * the live path's gap to PostgreSQL's commit rate. docs/benchmarks.md (Outbox, live) cites it.
 * Like bench:outbox it runs from the plain-JavaScript build, and takes its settings
 * (`BENCH_OUTBOX_EVENTS`, `_WARMUP_EVENTS`, `_ROUNDS`, `_WRITERS`, `_POOL`, `_BODY_BYTES`).
 * Prints one JSON line (`case` `writers`, `ratio`: module commits/s over pg's, median of the
 * rounds); its tables and queue are removed at the end, also on failure or Ctrl-C.
 */
import { Logger } from '@nestjs/common';
import { runBenchAsPlainJs } from '../harness/plain-js-run';
import { nestLogger } from '../harness/nest-logger';
import { medianOf, report, round2, median } from '../harness/report';
import { connectAmqp } from '../harness/resources';
import { onCleanup } from '../harness/cleanup';
import { progress } from '../harness/log';
import { moduleWritersOnly } from '../outbox.module';
import { rawCommits, type Timed } from '../outbox.raw';
import { makeEvents, settings } from '../outbox.settings';

async function main(): Promise<void> {
  Logger.overrideLogger(nestLogger('probe'));
  const connection = await connectAmqp(settings.amqpUrl);
  onCleanup('close the AMQP connection', () => connection.close());
  const measured: { pg: Timed; module: Timed }[] = [];
  for (let round = 0; round <= settings.rounds; round++) {
    const events = makeEvents(round === 0 ? settings.warmupEvents : settings.events);
    const paths = {
      pg: () => rawCommits(events),
      module: () => moduleWritersOnly(connection, events),
    };
    const order = round % 2 === 0 ? (['pg', 'module'] as const) : (['module', 'pg'] as const);
    const timed: Partial<Record<'pg' | 'module', Timed>> = {};
    for (const path of order) timed[path] = await paths[path]();
    const { pg, module } = timed as { pg: Timed; module: Timed };
    progress(
      `${round === 0 ? 'warm-up' : `round ${round}`}: pg ${rate(pg)}/s, module ${rate(module)}/s`,
    );
    if (round > 0) measured.push({ pg, module });
  }
  const ratios = measured.map(({ pg, module }) => round2(rate(module) / rate(pg)));
  report(
    { bench: 'outbox-writers', case: 'writers', variant: 'default', ratio: median(ratios) },
    {
      ratios,
      commitsPerSecond: {
        pg: median(measured.map(({ pg }) => rate(pg))),
        module: median(measured.map(({ module }) => rate(module))),
      },
      cpuMsPerThousandCommits: {
        pg: medianOf(measured.map(({ pg }) => ({ ...pg.cpu }))),
        module: medianOf(measured.map(({ module }) => ({ ...module.cpu }))),
      },
      walRecordsPerThousandCommits: {
        pg: median(measured.map(({ pg }) => pg.pgStats?.wal.records ?? NaN)),
        module: median(measured.map(({ module }) => module.pgStats?.wal.records ?? NaN)),
      },
      writers: settings.writers,
      poolSize: settings.poolSize,
    },
  );
}

function rate(timed: Timed): number {
  return Math.round(timed.messages / timed.seconds);
}

runBenchAsPlainJs('outbox-writers', __filename, main);
