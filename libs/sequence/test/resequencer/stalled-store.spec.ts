import { Redis } from 'ioredis';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { SettlementRecordingTransport } from '../claim-check/claim-check-test-app';
import { FreezingProxy, redisThroughProxy } from '../support/freezing-proxy';
import { useRedis } from '../support/redis.fixture';
import { eventually } from '../support/sequence-test-app';
import { describeWithServer } from '../support/servers';
import {
  createResequencerTestApp,
  publishEvent,
  type ResequencerTestApp,
} from './resequencer-test-app';
import { sleep } from './resequencer-parts';

const channel = 'transfers.status';
const LEASE_MS = 300;
const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;

/**
 * Resequencer: a store that stops answering (a frozen Redis, a network black hole: the connection
 * stays open, nothing is refused) must not hold an input message, and its prefetch slot, for
 * ever. Each store step is given up on after `tuning.storeTimeoutMs`: the input is requeued as for a store outage, and once the store answers again every event
 * is delivered, in order.
 */
describeWithServer('redis', 'Resequencer: a Redis store that never answers', () => {
  let t: ResequencerTestApp | undefined;
  let proxy: FreezingProxy | undefined;
  let client: Redis | undefined;
  const redis = useRedis({
    stem: 'nseq-rsq-stalled',
    beforeCleanup: async () => {
      proxy?.resume();
      await t?.close();
      t = undefined;
      client?.disconnect();
      await proxy?.close();
      proxy = undefined;
    },
  });
  let transport: SettlementRecordingTransport;

  async function boot(): Promise<ResequencerTestApp> {
    ({ proxy, client } = await redisThroughProxy(redis.client.options.port!));
    const store = new RedisResequencerStore(client, { prefix: redis.prefix });
    transport = new SettlementRecordingTransport();
    t = await createResequencerTestApp(
      { channel, gap: GAP },
      {
        transport,
        resequencer: { store },
        tuning: { leaseMs: LEASE_MS, storeTimeoutMs: LEASE_MS, backpressureDelayMs: 50 },
        publish: { confirmTimeoutMs: 100 },
      },
    );
    return t;
  }

  it('an accept that never answers: the input is requeued after storeTimeoutMs, and delivered once the store answers', async () => {
    const app = await boot();
    proxy!.freeze();
    await publishEvent(transport, channel, 'T1', 1);

    await eventually(
      () => transport.actionsOn(channel).includes('requeue'),
      'the input requeued while the store does not answer',
      4_000,
    );
    expect(app.handler.received).toHaveLength(0);

    proxy!.resume();
    await eventually(() => app.handler.of('T1').length === 1, 'event 1 delivered', 10_000);
    await transport.whenIdle();
    expect(app.handler.of('T1')).toEqual([1]);
    expect(transport.actionsOn(channel).at(-1)).toBe('ack');
  });

  it('renewals that never answer while the handler runs: the input is requeued, not held, and the key then drains in order', async () => {
    const app = await boot();
    let running = 0;
    let overlapped = false;
    let first = true;
    app.handler.onCall = async () => {
      running++;
      overlapped ||= running > 1;
      try {
        if (first) {
          first = false;
          // The store stops answering while the handler works for two leases.
          proxy!.freeze();
          await sleep(2 * LEASE_MS);
        }
      } finally {
        running--;
      }
    };
    await publishEvent(transport, channel, 'T1', 1);

    await eventually(
      () => transport.actionsOn(channel).includes('requeue'),
      'the input requeued once its drain could not settle',
      6_000,
    );

    proxy!.resume();
    await publishEvent(transport, channel, 'T1', 2);
    await eventually(() => app.handler.of('T1').includes(2), 'event 2 delivered', 10_000);
    await transport.whenIdle();
    // Event 1's settle never reached the store: it may come again (at least once), never after 2.
    const seqs = app.handler.of('T1');
    expect(seqs.at(-1)).toBe(2);
    expect(seqs.filter((seq) => seq === 2)).toHaveLength(1);
    expect([...new Set(seqs)]).toEqual([1, 2]);
    expect(overlapped).toBe(false);
  });
});
