import { storedChargeOf } from 'nest-sequence/testing';
import { randomUUID } from 'node:crypto';
import { InMemoryTransport } from 'nest-sequence';
import { RedisSequenceStore } from 'nest-sequence/redis';
import {
  bytes,
  createSequenceTestApp,
  makeFragments,
  metricValue,
  publishAll,
  type SequenceTestApp,
} from '../../test/support/sequence-test-app';
import { describeWithServer, SERVERS } from '../../test/support/servers';
import { redisClient } from '../../test/support/redis.fixture';

describeWithServer('redis', 'metrics on the shared Redis store', () => {
  const prefix = `nseq-metrics-${randomUUID()}`;
  const apps: SequenceTestApp[] = [];
  const stores: RedisSequenceStore[] = [];

  afterAll(async () => {
    await Promise.all(apps.map((app) => app.close()));
    await Promise.all(stores.map((store) => store.close()));
    const redis = redisClient();
    const keys = await redis.keys(`${prefix}:*`);
    if (keys.length > 0) await redis.del(...keys);
    await redis.quit();
  });

  it('reports the same open-sequence and buffered-bytes gauges on every instance', async () => {
    const channel = `metrics.shared.${randomUUID()}`;
    const transport = new InMemoryTransport();
    for (let i = 0; i < 2; i++) {
      const store = RedisSequenceStore.connect(SERVERS.redis.url, { prefix });
      stores.push(store);
      apps.push(
        await createSequenceTestApp(channel, {
          transport,
          sequence: { store },
        }),
      );
    }
    // Three sequences left open: the first fragment of each, stored by whichever instance.
    for (let s = 0; s < 3; s++) {
      await publishAll(
        transport,
        channel,
        makeFragments(`open-${s}`, bytes(2_000, s + 1), 1_000).slice(0, 1),
      );
    }
    await transport.whenIdle();

    const gauges = await Promise.all(
      apps.map(async ({ metrics }) => ({
        open: await metricValue(metrics.registry, 'nest_sequence_open_sequences'),
        buffered: await metricValue(metrics.registry, 'nest_sequence_buffered_bytes'),
      })),
    );
    expect(gauges[0]).toEqual({ open: 3, buffered: 3 * storedChargeOf(1_000) });
    expect(gauges[1]).toEqual(gauges[0]);
  });
});
