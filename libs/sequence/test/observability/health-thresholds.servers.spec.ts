import { ServiceUnavailableException, type INestApplicationContext } from '@nestjs/common';
import { HealthCheckService } from '@nestjs/terminus';
import { Test } from '@nestjs/testing';
import type { Registry } from 'prom-client';
import {
  OutboxService,
  ResequencerService,
  SEQUENCE_METRICS_REGISTRY,
  SequenceModule,
  type SequenceModuleOptions,
} from 'nest-sequence';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { RedisResequencerStore } from 'nest-sequence/redis';
import {
  OutboxHealthIndicator,
  ResequencerHealthIndicator,
  SequenceHealthModule,
  type HealthFinding,
} from 'nest-sequence/health';
import { RESEQUENCER_STORE } from '../../src/kernel/tokens';
import type { ResequencerStore } from '../../src/ports/resequencer-store.port';
import { describeWithServer, SERVERS } from '../support/servers';
import { deleteUnder, newPrefix, redisClient } from '../support/redis.fixture';
import { usePostgres } from '../support/postgres.fixture';
import { metricValue } from '../support/sequence-test-app';

const NO_SWEEPERS = {
  sweepers: { gaps: { intervalMs: false }, expiry: { intervalMs: false } },
} as const;

/** The app under test: the module on real servers, its health indicators, their terminus. */
async function start(options: SequenceModuleOptions): Promise<INestApplicationContext> {
  const moduleRef = await Test.createTestingModule({
    imports: [
      SequenceModule.forRoot({ isGlobal: true, tuning: NO_SWEEPERS, ...options }),
      SequenceHealthModule.forRoot({ outbox: { lagMs: 60_000 } }),
    ],
  }).compile();
  moduleRef.useLogger(false);
  return moduleRef.init();
}

/** What `HealthCheckService.check` answered: its 503 body's `error` part, or the result. */
async function terminusCheck(
  app: INestApplicationContext,
  check: () => Promise<unknown>,
): Promise<{ httpStatus: 200 | 503; body: Record<string, unknown> }> {
  try {
    const result = await app.get(HealthCheckService).check([check as never]);
    return { httpStatus: 200, body: result as unknown as Record<string, unknown> };
  } catch (error) {
    if (!(error instanceof ServiceUnavailableException)) throw error;
    return { httpStatus: 503, body: error.getResponse() as Record<string, unknown> };
  }
}

function trippedOf(body: Record<string, unknown>, key: string): HealthFinding[] {
  const error = body.error as Record<string, { tripped?: HealthFinding[] }>;
  return error[key].tripped ?? [];
}

describeWithServer('redis', 'health and gauges: the oldest gap on Redis', () => {
  const prefix = newPrefix('nseq-health');
  let app: INestApplicationContext | undefined;
  let store: RedisResequencerStore | undefined;

  afterEach(async () => {
    await app?.close();
    app = undefined;
    // A store passed in stays the caller's to close.
    await store?.close();
    store = undefined;
    const redis = redisClient();
    await deleteUnder(redis, prefix);
    await redis.quit();
  });

  it('turns the resequencer down past its gap timeout, and the gauges read the same gap', async () => {
    store = RedisResequencerStore.connect(SERVERS.redis.url, { prefix });
    app = await start({ resequencer: { store } });
    const gap = { timeoutMs: 60_000, policy: 'alert' as const };
    app.get(ResequencerService).create({ channel: 'transfers', gap }, () => undefined);
    const accept = (key: string, seq: number, now: number) =>
      app!
        .get<ResequencerStore>(RESEQUENCER_STORE)
        .accept(
          { scope: 'transfers', key },
          { seq, body: Buffer.from(`${key}-${seq}`), headers: {} },
          { start: 1, limits: { maxBufferedPerKey: 10, maxBufferedTotal: 100 }, now },
        );
    // Transfer T-1 waits on event 1 since two minutes ago, T-2 since ten seconds ago.
    const asked = Date.now();
    await accept('T-1', 3, asked - 120_000);
    await accept('T-2', 2, asked - 10_000);

    const { httpStatus, body } = await terminusCheck(app, () =>
      app!.get(ResequencerHealthIndicator).isHealthy('resequencer'),
    );

    expect(httpStatus).toBe(503);
    const [finding, ...others] = trippedOf(body, 'resequencer');
    expect(others).toEqual([]);
    expect(finding).toMatchObject({
      threshold: 'resequencer.oldestGapAgeMs',
      subject: 'transfers',
      limit: 60_000,
      runbook: 'docs/operations.md#open-gap',
    });
    expect(finding.value).toBeGreaterThanOrEqual(120_000);
    expect(finding.value).toBeLessThanOrEqual(Date.now() - asked + 120_000);

    const registry = app.get<Registry>(SEQUENCE_METRICS_REGISTRY);
    const labels = { resequencer: 'transfers' };
    expect(await metricValue(registry, 'nest_sequence_resequencer_open_gaps', labels)).toBe(2);
    const age = await metricValue(
      registry,
      'nest_sequence_resequencer_oldest_gap_age_seconds',
      labels,
    );
    expect(age).toBeGreaterThanOrEqual(120);
    expect(age).toBeLessThanOrEqual((Date.now() - asked + 120_000) / 1000);
  });
});

describeWithServer('postgres', 'health and gauges: the outbox lag on PostgreSQL', () => {
  const pg = usePostgres({
    beforeCleanup: async () => {
      await app?.close();
      app = undefined;
      await store?.close();
      store = undefined;
    },
  });
  let app: INestApplicationContext | undefined;
  let store: PostgresOutboxStore | undefined;

  it('turns the outbox down once its oldest pending record is older than lagMs, and the gauges agree', async () => {
    const { tablePrefix } = pg;
    store = PostgresOutboxStore.connect(SERVERS.postgres.url, { tablePrefix });
    app = await start({
      outbox: {
        store,
        // No relay: the record stays pending, as behind a relay that stopped.
        outboxEvents: { enabled: false },
      },
    });
    await app.get(OutboxService).transaction(async (tx) => {
      tx.publishEvent({ type: 'TransferBooked', aggregateType: 'T', aggregateId: '1', payload: 1 });
    });
    const up = await terminusCheck(app, () => app!.get(OutboxHealthIndicator).isHealthy('outbox'));
    expect(up.httpStatus).toBe(200);

    // The record was committed five minutes ago, as the relay's lag would leave it.
    await pg.admin.query(
      `UPDATE ${tablePrefix}outbox_events SET created_at = created_at - interval '5 minutes'`,
    );
    const { httpStatus, body } = await terminusCheck(app, () =>
      app!.get(OutboxHealthIndicator).isHealthy('outbox'),
    );

    expect(httpStatus).toBe(503);
    const error = body.error as Record<string, { boxes: Record<string, unknown> }>;
    expect(error.outbox.boxes.outbox_events).toEqual({
      pending: 1,
      failed: 0,
      lagMs: expect.any(Number),
    });
    const [finding, ...others] = trippedOf(body, 'outbox');
    expect(others).toEqual([]);
    expect(finding).toMatchObject({
      threshold: 'outbox.lagMs',
      subject: 'outbox_events',
      limit: 60_000,
      runbook: 'docs/operations.md#outbox-lag',
    });
    expect(finding.value).toBeGreaterThanOrEqual(300_000);
    expect(finding.message).toMatch(
      /^outbox_events lag 5(\.\d)? min \(oldest pending record\), limit 60 s$/,
    );

    const registry = app.get<Registry>(SEQUENCE_METRICS_REGISTRY);
    const box = { box: 'outbox_events' };
    expect(await metricValue(registry, 'nest_sequence_outbox_pending', box)).toBe(1);
    expect(await metricValue(registry, 'nest_sequence_outbox_failed', box)).toBe(0);
    expect(
      await metricValue(registry, 'nest_sequence_outbox_oldest_pending_age_seconds', box),
    ).toBeGreaterThanOrEqual(300);
  });
});
