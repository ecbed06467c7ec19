import { randomUUID } from 'node:crypto';
import { Redis } from 'ioredis';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { describeWithServer, SERVERS } from '../libs/sequence/test/support/servers';
import { redisClient } from '../libs/sequence/test/support/redis.fixture';
import type { TransferView, TransfersSummary } from '../src/transfers/transfer-status.projection';
import { transferChannels } from '../src/transfers/transfer-status.channels';
import { DEMO_BROKERS } from './support/demo-broker';
import {
  killIfRunning,
  npmScript,
  start,
  terminate,
  type RunningProcess,
} from './support/demo-process';

const TRANSFERS = 100;

for (const broker of DEMO_BROKERS) {
  describeWithServer(broker.server, `transfers demo ${broker.label}`, () => {
    describeWithServer('redis', 'and Redis', () => {
      // Queues and keys of this run only: nothing it leaves can meet another run's.
      const prefix = `transfers-e2e-${randomUUID().slice(0, 8)}`;
      const channels = transferChannels(`${prefix}.`);
      const env = {
        ...broker.env,
        REDIS_URL: SERVERS.redis.url,
        SEQUENCE_REDIS_PREFIX: prefix,
        TRANSFERS_CHANNEL_PREFIX: `${prefix}.`,
        TRANSFERS: String(TRANSFERS),
        TRANSFER_GAP_TIMEOUT_MS: '1000',
        PORT: '0',
        SERVE: '1',
        PAYLOAD_DIR: undefined,
        CLAIM_CHECK_ABOVE_BYTES: undefined,
        CLAIM_CHECK_KEY: undefined,
      };
      let redis: Redis;
      let demo: RunningProcess | undefined;

      async function cleanUp(): Promise<void> {
        await broker.deleteChannels([channels.shuffled, channels.ordered]);
        const keys = await redis.keys(`${prefix}:*`);
        if (keys.length > 0) await redis.del(...keys);
      }

      beforeAll(async () => {
        await broker.open();
        redis = redisClient();
        await cleanUp();
      });

      afterEach(async () => {
        await killIfRunning(demo);
        demo = undefined;
      });

      afterAll(async () => {
        await cleanUp();
        await broker.close();
        redis.disconnect();
      });

      it(`settles every transfer in order through ${broker.transportName} and the Redis store, alerts on the broken one, serves its API, and stops on SIGTERM`, async () => {
        demo = start(...npmScript('demo:transfers'), env);
        await demo.waitForOutput('all checks passed', 50_000);
        const port = /transfers API on http:\/\/localhost:(\d+)\//.exec(demo.output().stdout)?.[1];
        const get = async (path: string) => {
          const response = await fetch(`http://127.0.0.1:${port}${path}`);
          return { status: response.status, body: await response.json() };
        };

        expect(demo.output().stdout).toContain(
          `on the ${broker.transportName} transport and the redis resequencer store`,
        );
        const summary = (await get('/transfers')).body as TransfersSummary;
        expect(summary).toMatchObject({
          transfers: TRANSFERS,
          byStatus: { initiated: 1, processing: 0, settled: TRANSFERS - 1 },
          regressionsRefused: 0,
          gaps: [{ id: expect.any(String), expected: 2 }],
        });
        const brokenId = summary.gaps[0].id;
        // The broken transfer's gap is alerted; so may be others: a transfer whose statuses
        // arrive more than the gap timeout apart (a loaded machine) has a gap open that long,
        // which is alerted, once, before it fills. How many depends on timing.
        expect(summary.gapAlerts).toBeGreaterThanOrEqual(1);
        expect(await get(`/transfers/${brokenId}/status`)).toEqual({
          status: 200,
          body: {
            id: brokenId,
            status: 'initiated',
            seq: 1,
            gap: { expected: 2, since: summary.gaps[0].since },
          } satisfies TransferView,
        });
        expect(await get('/transfers/E00000000000000000000NOSUCHID00/status')).toMatchObject({
          status: 404,
        });

        // The broken transfer's state is in Redis, where any instance would find it: waiting for
        // 2, holding 3.
        const store = new RedisResequencerStore(redis, { prefix });
        await expect(
          store.inspect({ scope: channels.shuffled, key: brokenId }, 1),
        ).resolves.toEqual(expect.objectContaining({ next: 2, buffered: [3], handOff: 0 }));

        // Each alert the projection heard is also recorded on the shuffled channel's dead-letter
        // channel, the broken transfer's among them, and each gap once ("reported once per gap");
        // nothing is left unconsumed on the ordered one.
        const alerts: { key: string; expected: number; gapSince: number }[] = [];
        for (let i = 0; i < summary.gapAlerts; i++) {
          const record = await broker.nextMessage(`${channels.shuffled}.dlq`, 10_000);
          expect(record.headers['x-death-reason']).toMatch(/^resequencer-gap-alert/);
          const alert = JSON.parse(record.body.toString('utf8')) as (typeof alerts)[number];
          expect(alert).toMatchObject({ type: 'alert', key: expect.any(String) });
          alerts.push(alert);
        }
        const gaps = alerts.map(({ key, expected, gapSince }) => `${key}:${expected}@${gapSince}`);
        expect(new Set(gaps).size).toBe(gaps.length);
        expect(alerts).toContainEqual(
          expect.objectContaining({
            key: brokenId,
            expected: 2,
            gapSince: Date.parse(summary.gaps[0].since),
          }),
        );
        expect(await broker.pending(channels.ordered)).toBe(0);

        expect(await terminate(demo)).toMatchObject({
          code: 0,
          signal: null,
        });
      });
    });
  });
}
