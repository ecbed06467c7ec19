import 'reflect-metadata';
import type { INestApplication } from '@nestjs/common';
import { ResequencerService, SEQUENCE_TRANSPORT, type Transport } from 'nest-sequence';
import type { Registry } from 'prom-client';
import { TransfersAppModule } from './app.module';
import { runHttpScenario, runUntilServingOrDone } from './demo.command';
import { readDemoEnvironment } from './demo.environment';
import { DEMO_ADAPTERS, DEMO_METRICS, type DemoAdapters } from './infrastructure';
import { TransferStatusProjection } from './transfers/transfer-status.projection';
import { TransferStatusResequencer } from './transfers/transfer-status.resequencer';
import {
  describeRun,
  failedChecks,
  type HttpAnswer,
  type TransfersRun,
} from './transfers/transfers-run.report';
import {
  readTransfersEnvironment,
  type TransfersEnvironment,
} from './transfers/transfers.environment';
import { UpstreamSimulator } from './transfers/upstream.simulator';

/** Beyond the gap timeout: how long the statuses may take to go through the broker and store. */
const SETTLE_MARGIN_MS = 60_000;

/**
 * `npm run demo:transfers`: instant-payment transfers. Three upstream services publish the
 * statuses of TRANSFERS transfers shuffled; the resequencer releases each transfer's in order;
 * the projection serves them on GET /transfers/:id/status. One transfer never gets its
 * `processing` status and raises a gap alert. Prints a summary, checks it, queries its own HTTP
 * API, then exits (0 when every check passed), or keeps serving with SERVE=1.
 */
async function main(): Promise<'serving' | number> {
  const environment = readTransfersEnvironment(process.env);
  readDemoEnvironment(process.env); // the shared module reads it too: a usage error, not a trace
  return runHttpScenario({
    module: TransfersAppModule.register(environment),
    port: environment.port,
    serve: environment.serve,
    listening: (port) => `transfers API on http://localhost:${port}/transfers`,
    serving: (port) => `serving http://localhost:${port}/transfers until Ctrl-C (SERVE=1)`,
    run: async (app, base) => {
      const run = await runTransfers(app, base, environment);
      return { lines: describeRun(run), problems: failedChecks(run) };
    },
  });
}

/** The simulation, then what the projection, the store and the API say of it. */
async function runTransfers(
  app: INestApplication,
  base: string,
  environment: TransfersEnvironment,
): Promise<TransfersRun> {
  const started = Date.now();
  const simulation = await app.get(UpstreamSimulator).run(environment.transfers);
  await app
    .get(TransferStatusProjection)
    .whenFinal(simulation, environment.gapTimeoutMs + SETTLE_MARGIN_MS);
  const elapsedMs = Date.now() - started;

  const resequencer = app.get(TransferStatusResequencer).name;
  const good = simulation.transferIds.find((id) => id !== simulation.brokenTransferId)!;
  return {
    adapters: {
      transport: app.get<Transport>(SEQUENCE_TRANSPORT).name,
      store:
        app.get<DemoAdapters>(DEMO_ADAPTERS).stores.find((set) => set.resequencerStore)
          ?.resequencerStore?.name ?? 'memory',
    },
    channels: environment.channels,
    gapTimeoutMs: environment.gapTimeoutMs,
    simulation,
    summary: app.get(TransferStatusProjection).summary(),
    heldBack: await heldBack(app, resequencer),
    brokenInStore: await app
      .get(ResequencerService)
      .inspect(resequencer, simulation.brokenTransferId),
    elapsedMs,
    broken: await getStatus(base, simulation.brokenTransferId),
    good: await getStatus(base, good),
  };
}

async function getStatus(base: string, id: string): Promise<HttpAnswer> {
  const path = `/transfers/${encodeURIComponent(id)}/status`;
  const response = await fetch(base + path);
  return { path, status: response.status, body: await response.json() };
}

/**
 * How many statuses arrived before the one they follow and waited in the store: the resequencer's
 * `buffered` intake count, read from the module's metrics.
 */
async function heldBack(app: INestApplication, resequencer: string): Promise<number> {
  const metrics = await app.get<Registry>(DEMO_METRICS).getMetricsAsJSON();
  const events = metrics.find((metric) => metric.name.endsWith('resequencer_events_total'));
  return (events?.values ?? [])
    .filter(({ labels }) => labels.resequencer === resequencer && labels.outcome === 'buffered')
    .reduce((sum, { value }) => sum + value, 0);
}

runUntilServingOrDone(main);
