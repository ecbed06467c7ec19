import type { INestApplication } from '@nestjs/common';
import { ResequenceHeader } from 'nest-sequence/wire';
import {
  InMemoryTransport,
  SEQUENCE_TRANSPORT,
  type GapEvent,
  type ResequencerService,
} from 'nest-sequence';
import { TransfersAppModule } from '../src/app.module';
import {
  transferChannels,
  type TransferStatusMessage,
} from '../src/transfers/transfer-status.channels';
import {
  TransferStatusProjection,
  type TransfersSummary,
} from '../src/transfers/transfer-status.projection';
import type { TransferStatusResequencer } from '../src/transfers/transfer-status.resequencer';
import type { TransfersSettings } from '../src/transfers/transfers.environment';
import { UpstreamSimulator, type SimulationReport } from '../src/transfers/upstream.simulator';
import { npmScript, run } from './support/demo-process';
import { listenEmbedded } from './support/embedded-app';

/** The embedded defaults, whatever the environment of the test run says. */
const NO_SERVERS = {
  AMQP_URL: undefined,
  NATS_URL: undefined,
  REDIS_URL: undefined,
  PAYLOAD_DIR: undefined,
  CLAIM_CHECK_ABOVE_BYTES: undefined,
  CLAIM_CHECK_KEY: undefined,
  TRANSFERS_CHANNEL_PREFIX: undefined,
  SERVE: undefined,
};
type GapListener = Parameters<ResequencerService['onGap']>[0];

/** Short, so that the broken transfer's alert comes within a sweep or two. */
const GAP_TIMEOUT_MS = 300;

describe('transfers demo on the embedded defaults', () => {
  it('npm run demo:transfers settles every transfer in order, alerts on the broken one, and checks its own HTTP API', async () => {
    const exit = await run(...npmScript('demo:transfers'), {
      ...NO_SERVERS,
      TRANSFERS: '60',
      TRANSFER_GAP_TIMEOUT_MS: String(GAP_TIMEOUT_MS),
      PORT: '0',
    });

    expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 0 });
    expect(exit.stdout).toContain('on the in-memory transport and the memory resequencer store');
    expect(exit.stdout).toContain('60 transfers: 179 statuses published shuffled');
    // At least the broken transfer's `settled` waited, behind its missing `processing`.
    expect(exit.stdout).toMatch(/ [1-9]\d* statuses arrived ahead of their turn and waited/);
    expect(exit.stdout).toContain('59 transfers settled; 178 statuses applied in order');
    expect(exit.stdout).toContain('statuses refused as regressions: 0');
    expect(exit.stdout).toMatch(
      /gap alert: transfer (E\d{20}\w{11}) waits for seq 2 \(processing\) since .*; the resequencer holds seq 3 \(settled\) behind it/,
    );
    expect(exit.stdout).toMatch(
      /GET \/transfers\/E\w+\/status -> 200 \{"id":"E\w+","status":"initiated","seq":1,"gap":\{"expected":2,/,
    );
    expect(exit.stdout).toMatch(
      /GET \/transfers\/E\w+\/status -> 200 \{"id":"E\w+","status":"settled","seq":3\}/,
    );
    expect(exit.stdout).toContain('all checks passed');
  });

  it('npm run demo:transfers refuses a TRANSFERS or TRANSFER_GAP_TIMEOUT_MS it cannot use, naming both', async () => {
    const exit = await run(...npmScript('demo:transfers'), {
      ...NO_SERVERS,
      TRANSFERS: '2e3',
      TRANSFER_GAP_TIMEOUT_MS: '0',
    });

    expect(exit.code).toBe(2);
    expect(exit.stderr).toContain('TRANSFERS must be a whole number from 1 to 100000, got "2e3"');
    expect(exit.stderr).toContain(
      'TRANSFER_GAP_TIMEOUT_MS must be a whole number from 1 to 3600000, got "0"',
    );
  });

  describe('in process, over HTTP', () => {
    const settings: TransfersSettings = {
      channels: transferChannels(),
      gapTimeoutMs: GAP_TIMEOUT_MS,
    };
    let app: INestApplication;
    let base: string;

    const get = async (path: string) => {
      const response = await fetch(base + path);
      return { status: response.status, body: await response.json() };
    };

    beforeEach(async () => {
      ({ app, base } = await listenEmbedded(TransfersAppModule.register(settings)));
    });

    afterEach(async () => {
      await app.close();
    });

    async function simulate(transfers: number): Promise<SimulationReport> {
      const simulation = await app.get(UpstreamSimulator).run(transfers);
      await app.get(TransferStatusProjection).whenFinal(simulation, 20_000);
      return simulation;
    }

    it('shows every transfer settled at seq 3, and the broken one at initiated with a gap expecting 2', async () => {
      const { transferIds, brokenTransferId } = await simulate(40);

      for (const id of transferIds) {
        const { status, body } = await get(`/transfers/${id}/status`);
        expect({ status, body }).toEqual(
          id === brokenTransferId
            ? {
                status: 200,
                body: {
                  id,
                  status: 'initiated',
                  seq: 1,
                  gap: { expected: 2, since: expect.stringMatching(/^\d{4}-\d\d-\d\dT/) },
                },
              }
            : { status: 200, body: { id, status: 'settled', seq: 3 } },
        );
      }
    });

    it('summarises 39 settled, 1 initiated, no status refused as a regression, one open gap', async () => {
      const { brokenTransferId } = await simulate(40);

      const { status, body } = await get('/transfers');

      expect(status).toBe(200);
      expect(body).toEqual<TransfersSummary>({
        transfers: 40,
        byStatus: { initiated: 1, processing: 0, settled: 39 },
        applied: 40 * 3 - 2,
        duplicatesIgnored: 0,
        regressionsRefused: 0,
        // The broken transfer's, and one for any other whose statuses came further apart than
        // the gap timeout (a loaded machine): how many is timing.
        gapAlerts: expect.any(Number),
        gaps: [{ id: brokenTransferId, expected: 2, since: expect.any(String) }],
      });
      expect((body as TransfersSummary).gapAlerts).toBeGreaterThanOrEqual(1);
    });

    it('records the gap alert on the shuffled channel’s dead-letter channel, naming the transfer and the missing seq', async () => {
      const { brokenTransferId } = await simulate(10);

      const transport = app.get<InMemoryTransport>(SEQUENCE_TRANSPORT);
      const records = transport.peek(`${settings.channels.shuffled}.dlq`);
      expect(records).toHaveLength(1);
      expect(records[0].headers['x-death-reason']).toMatch(/^resequencer-gap-alert/);
      expect(JSON.parse(records[0].body.toString('utf8'))).toMatchObject({
        type: 'alert',
        key: brokenTransferId,
        expected: 2,
        buffered: 1,
      });
    });

    it('answers 404 for a transfer it never heard of', async () => {
      await simulate(5);

      const { status, body } = await get('/transfers/E00000000000000000000NOSUCHID00/status');

      expect(status).toBe(404);
      expect(body).toMatchObject({ statusCode: 404, message: expect.stringContaining('NOSUCHID') });
    });

    it('refuses and counts a status older than the one it shows (what ordered delivery prevents)', async () => {
      const { transferIds } = await simulate(3);
      const id = transferIds[0];
      const stale: TransferStatusMessage = {
        transferId: id,
        status: 'initiated',
        at: new Date().toISOString(),
        source: 'a replay',
        amountCents: 1,
      };

      const transport = app.get<InMemoryTransport>(SEQUENCE_TRANSPORT);
      await transport.publish(settings.channels.ordered, Buffer.from(JSON.stringify(stale)), {
        [ResequenceHeader.key]: id,
        [ResequenceHeader.seq]: 1,
      });
      await transport.whenIdle();

      expect(await get(`/transfers/${id}/status`)).toEqual({
        status: 200,
        body: { id, status: 'settled', seq: 3 },
      });
      expect(await get('/transfers')).toMatchObject({ body: { regressionsRefused: 1 } });
    });
  });

  describe('the projection waiting for a run to end', () => {
    const channels = transferChannels('when-final.');
    let transport: InMemoryTransport;
    let projection: TransferStatusProjection;
    let reportGap: GapListener;

    beforeEach(async () => {
      transport = new InMemoryTransport();
      const resequencers = {
        onGap: (listener: GapListener) => {
          reportGap = listener;
          return () => undefined;
        },
      } as unknown as ResequencerService;
      const resequencer = { name: channels.shuffled } as TransferStatusResequencer;
      projection = new TransferStatusProjection(
        transport,
        { channels, gapTimeoutMs: GAP_TIMEOUT_MS },
        resequencers,
        resequencer,
      );
      projection.onModuleInit();
      await projection.onApplicationBootstrap();
    });

    afterEach(async () => {
      await projection.beforeApplicationShutdown();
      await transport.close();
    });

    async function deliver(id: string, seq: number): Promise<void> {
      const status = (['initiated', 'processing', 'settled'] as const)[seq - 1];
      const message: TransferStatusMessage = {
        transferId: id,
        status,
        at: new Date().toISOString(),
        source: 'test',
        amountCents: 1,
      };
      await transport.publish(channels.ordered, Buffer.from(JSON.stringify(message)), {
        [ResequenceHeader.key]: id,
        [ResequenceHeader.seq]: seq,
      });
      await transport.whenIdle();
    }

    const alert = (id: string, expected: number): GapEvent => ({
      type: 'alert',
      resequencer: channels.shuffled,
      key: id,
      expected,
      buffered: 1,
      gapSince: Date.now(),
    });

    it('does not count a transfer alerted on a gap that then fills as done: only the broken one ends at its alert', async () => {
      // 'slow' had its settled status long before its processing one: alerted, then it settles.
      await deliver('good', 1);
      await deliver('good', 2);
      await deliver('good', 3);
      await deliver('slow', 1);
      await reportGap(alert('slow', 2));
      await deliver('broken', 1);
      await reportGap(alert('broken', 2));

      let ended = false;
      const waiting = projection
        .whenFinal({ transferIds: ['good', 'slow', 'broken'], brokenTransferId: 'broken' }, 10_000)
        .then(() => (ended = true));
      await transport.whenIdle();
      await new Promise((resolve) => setImmediate(resolve));
      expect(ended).toBe(false);

      await deliver('slow', 2);
      await deliver('slow', 3);
      await waiting;
      expect(projection.summary()).toMatchObject({
        byStatus: { initiated: 1, processing: 0, settled: 2 },
        gapAlerts: 2,
        gaps: [{ id: 'broken', expected: 2 }],
      });
    });
  });
});
