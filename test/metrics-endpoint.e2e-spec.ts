import type { INestApplication } from '@nestjs/common';
import { TransfersAppModule } from '../src/app.module';
import { MetricsEndpoint } from '../src/metrics-endpoint';
import { transferChannels } from '../src/transfers/transfer-status.channels';
import { UpstreamSimulator } from '../src/transfers/upstream.simulator';
import { TransferStatusProjection } from '../src/transfers/transfer-status.projection';
import { npmScript, run } from './support/demo-process';
import { listenEmbedded } from './support/embedded-app';

/**
 * METRICS_PORT: every demo serves the module's registry in Prometheus's text format, what the
 * `observability` profile of docker-compose.yml scrapes.
 */
describe('demo metrics endpoint (METRICS_PORT)', () => {
  describe('in process', () => {
    let app: INestApplication | undefined;
    const saved = { port: process.env.METRICS_PORT, host: process.env.METRICS_HOST };

    afterEach(async () => {
      await app?.close();
      app = undefined;
      process.env.METRICS_PORT = saved.port;
      process.env.METRICS_HOST = saved.host;
      if (saved.port === undefined) delete process.env.METRICS_PORT;
      if (saved.host === undefined) delete process.env.METRICS_HOST;
    });

    async function start(env: { METRICS_PORT?: string }): Promise<INestApplication> {
      if (env.METRICS_PORT === undefined) delete process.env.METRICS_PORT;
      else process.env.METRICS_PORT = env.METRICS_PORT;
      delete process.env.METRICS_HOST;
      ({ app } = await listenEmbedded(
        TransfersAppModule.register({ channels: transferChannels(), gapTimeoutMs: 300 }),
      ));
      return app;
    }

    it("serves the module's metrics at /metrics on loopback, with the demo's activity in them", async () => {
      const started = await start({ METRICS_PORT: '0' });
      const simulation = await started.get(UpstreamSimulator).run(3);
      await started.get(TransferStatusProjection).whenFinal(simulation, 20_000);

      const url = started.get(MetricsEndpoint).url();
      expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
      const response = await fetch(url!);
      expect(response.status).toBe(200);
      expect(response.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
      const text = await response.text();
      expect(text).toContain('# TYPE nest_sequence_dead_letters_total counter');
      expect(text).toMatch(
        /^nest_sequence_resequencer_delivered_total\{resequencer="[^"]+"\} \d+/m,
      );

      const other = await fetch(url!.replace(/\/metrics$/, '/other'));
      expect(other.status).toBe(404);
    });

    it('serves nothing without METRICS_PORT', async () => {
      const started = await start({});
      expect(started.get(MetricsEndpoint).url()).toBeUndefined();
    });
  });

  it('a demo refuses a METRICS_PORT it cannot use, naming it (exit code 2)', async () => {
    const exit = await run(...npmScript('demo:transfers'), {
      AMQP_URL: undefined,
      NATS_URL: undefined,
      REDIS_URL: undefined,
      METRICS_PORT: '70000',
    });

    expect(exit.code).toBe(2);
    expect(exit.stderr).toContain(
      'METRICS_PORT must be a port number from 0 to 65535 (0 picks a free one), got "70000"',
    );
  });
});
