import { randomBytes } from 'node:crypto';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { type GapPolicy } from 'nest-sequence/ports';
import { type HeaderMap } from 'nest-sequence/wire';
import { eventually, metricValue } from '../support/sequence-test-app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';
import {
  createResequencerApp,
  publishKeyedEvent,
  type ResequencerApp,
} from './support/resequencer-app';
import { QueueCollector } from './support/resequencer-output';

jest.setTimeout(30_000);

const TIMEOUT_MS = 300;
/** The sweeper's real timer, on every instance. */
const SWEEP_INTERVAL_MS = 100;

/**
 * The gap policies with their real timers on the real servers: the gap sweeper runs every
 * 100 ms on each instance, gaps time out after 300 ms, and gap records and dead-lettered events
 * go to the resequencer's dead-letter queue on RabbitMQ.
 */
describeOnRealServers('faults: Resequencer gap policies on RabbitMQ and Redis', () => {
  let inspector: RedisResequencerStore;
  let channel: string;
  let dlq: QueueCollector;
  const apps: ResequencerApp[] = [];
  const servers = useFaultServers({
    producer: true,
    beforeCleanup: async () => {
      for (const app of apps.splice(0)) await app.close();
    },
  });

  beforeEach(() => {
    channel = servers.admin.newChannel();
    inspector = new RedisResequencerStore(servers.redis, { prefix: servers.prefix });
    dlq = new QueueCollector(servers.admin, `${channel}.dlq`);
  });

  async function start(policy: GapPolicy): Promise<ResequencerApp> {
    const app = await createResequencerApp(
      { channel, gap: { timeoutMs: TIMEOUT_MS, policy } },
      { prefix: servers.prefix, gapSweepIntervalMs: SWEEP_INTERVAL_MS },
    );
    apps.push(app);
    return app;
  }

  const publish = async (key: string, seqs: number[], headers: HeaderMap = {}) => {
    for (const seq of seqs)
      await publishKeyedEvent(servers.producer, channel, { key, seq, headers });
  };
  const stateOf = (key: string) => inspector.inspect({ scope: channel, key }, 1);
  const reasons = () => dlq.messages.map((message) => String(message.headers['x-death-reason']));
  const gapMetric = (app: ResequencerApp, type: string) =>
    metricValue(app.registry, 'nest_sequence_resequencer_gaps_total', { type });
  const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

  it("'alert': after the timeout, records the gap once (dead-letter record, event, metric), keeps waiting; the late event then releases all", async () => {
    const t = await start('alert');
    const publishedAt = Date.now();
    await publish('T1', [2, 3]);

    await eventually(() => t.gaps.length === 1, 'the gap alert', 3_000);
    const alertedAt = Date.now();
    expect(alertedAt - publishedAt).toBeGreaterThanOrEqual(TIMEOUT_MS);
    expect(t.gaps).toEqual([
      {
        type: 'alert',
        resequencer: channel,
        key: 'T1',
        expected: 1,
        buffered: 2,
        gapSince: expect.any(Number),
      },
    ]);
    await dlq.atLeast(1, 'the alert record');
    expect(reasons()).toEqual([
      expect.stringMatching(
        /^resequencer-gap-alert: key T1 has waited for 1 since .*still waiting$/,
      ),
    ]);
    expect(dlq.messages[0].headers).toMatchObject({
      'x-resequence-key': 'T1',
      'content-type': 'application/json',
    });
    expect(JSON.parse(dlq.messages[0].body.toString())).toEqual({
      kind: 'resequencer-gap-alert',
      ...t.gaps[0],
    });
    expect(await gapMetric(t, 'alert')).toBe(1);

    // Still waiting, and not alerted again: many sweeps and timeouts later, nothing changed.
    await pause(3 * TIMEOUT_MS);
    expect(t.gaps).toHaveLength(1);
    expect(await dlq.collect()).toHaveLength(1);
    expect(t.handler.received).toEqual([]);
    expect(await stateOf('T1')).toMatchObject({ next: 1, buffered: [2, 3] });
    // The gap is still open: inspection lists it, as alerted.
    expect(await t.service.openGaps(channel)).toEqual([
      {
        key: 'T1',
        expected: 1,
        buffered: 2,
        lowest: 2,
        gapSince: (await stateOf('T1')).gapSince,
        alerted: true,
      },
    ]);

    await publish('T1', [1]);
    await eventually(() => t.handler.received.length === 3, 'the released run');
    expect(t.handler.of('T1')).toEqual([1, 2, 3]);
    // Settles are sent a moment after the handler returns (batched per event-loop turn).
    await eventually(async () => (await stateOf('T1')).handOff === 0, 'the run settled');
    expect(await stateOf('T1')).toEqual({ next: 4, buffered: [], handOff: 0 });
    expect(await dlq.collect()).toHaveLength(1);
  });

  it("'skip': records each missing range once it times out and releases what follows; late events are dropped", async () => {
    const t = await start('skip');
    await publish('T1', [3, 4, 6]);

    await eventually(() => t.handler.of('T1').length === 2, 'events 3 and 4', 3_000);
    // Releasing 3-4 left 6 behind a new gap (5), which waits for its own timeout: not skipped
    // with the first one.
    expect(t.handler.of('T1')).toEqual([3, 4]);
    expect(t.gaps).toHaveLength(1);
    await eventually(() => t.handler.of('T1').length === 3, 'event 6', 3_000);
    expect(t.handler.of('T1')).toEqual([3, 4, 6]);
    expect(t.gaps).toEqual([
      { type: 'skipped', resequencer: channel, key: 'T1', from: 1, to: 2 },
      { type: 'skipped', resequencer: channel, key: 'T1', from: 5, to: 5 },
    ]);
    await dlq.atLeast(2, 'two skip records');
    expect(reasons()).toEqual([
      expect.stringMatching(/^resequencer-gap-skipped: key T1: gave up waiting for 1-2;/),
      expect.stringMatching(/^resequencer-gap-skipped: key T1: gave up waiting for 5;/),
    ]);
    expect(JSON.parse(dlq.messages[1].body.toString())).toEqual({
      kind: 'resequencer-gap-skipped',
      ...t.gaps[1],
    });
    expect(await gapMetric(t, 'skipped')).toBe(2);

    await publish('T1', [1, 5, 7]); // 1 and 5 are late now; 7 is next
    await eventually(() => t.handler.of('T1').length === 4, 'event 7');
    await eventually(
      async () => (await servers.admin.readyCount(channel)) === 0,
      'the input drained',
    );
    expect(t.handler.of('T1')).toEqual([3, 4, 6, 7]);
    expect(await dlq.collect()).toHaveLength(2);
  });

  it("'dead-letter': moves the buffered events to the dead-letter queue, byte-exact, with the reason; the key moves on", async () => {
    const t = await start('dead-letter');
    const bodies = [2, 3].map(() => Buffer.concat([Buffer.from([0x00, 0xfe]), randomBytes(100)]));
    for (const [i, seq] of [2, 3].entries()) {
      await publishKeyedEvent(servers.producer, channel, {
        key: 'T1',
        seq,
        body: bodies[i],
        headers: { tenant: 'acme', attempt: seq },
      });
    }

    await dlq.atLeast(2, 'the two buffered events', 3_000);
    expect(dlq.messages.map((message) => message.body.equals(bodies.shift()!))).toEqual([
      true,
      true,
    ]);
    expect(dlq.messages.map((message) => message.headers)).toEqual(
      [2, 3].map((seq) => ({
        tenant: 'acme',
        attempt: seq,
        'x-resequence-key': 'T1',
        'x-resequence-seq': seq,
        'x-death-reason': expect.stringMatching(
          new RegExp(
            `^resequencer-gap-dead-letter: key T1: event ${seq} was buffered while 1 stayed ` +
              `missing past gap.timeoutMs \\(${TIMEOUT_MS} ms\\); moved out unreleased$`,
          ),
        ),
      })),
    );
    await eventually(() => t.gaps.length === 2, 'two gap events');
    expect(t.gaps).toEqual(
      [2, 3].map((seq) => ({
        type: 'dead-lettered',
        resequencer: channel,
        key: 'T1',
        seq,
        expected: 1,
      })),
    );
    expect(await gapMetric(t, 'dead-lettered')).toBe(2);
    // Settles are sent a moment after the handler returns (batched per event-loop turn).
    await eventually(async () => (await stateOf('T1')).handOff === 0, 'the run settled');
    expect(await stateOf('T1')).toEqual({ next: 4, buffered: [], handOff: 0 });
    expect(t.handler.received).toEqual([]);

    await publish('T1', [1, 4]); // 1 is late now; 4 is next
    await eventually(() => t.handler.received.length === 1, 'event 4');
    await eventually(
      async () => (await servers.admin.readyCount(channel)) === 0,
      'the input drained',
    );
    expect(t.handler.of('T1')).toEqual([4]);
    expect(await dlq.collect()).toHaveLength(2);
  });

  it("'alert': two instances sweeping the same Redis alert each gap once, however long it stays open", async () => {
    const instances = [await start('alert'), await start('alert')];
    const keys = Array.from({ length: 20 }, (_, i) => `A${i}`);
    for (const key of keys) await publish(key, [2, 3]);

    const alerts = () => instances.flatMap((app) => app.gaps);
    await eventually(() => alerts().length >= keys.length, 'every key alerted', 5_000);
    await dlq.atLeast(keys.length, 'one alert record per key');
    // Many overlapping sweeps of both instances, each finding every gap past its timeout.
    await pause(4 * TIMEOUT_MS);

    expect(
      alerts()
        .map((gap) => `${gap.type}:${gap.key}`)
        .sort(),
    ).toEqual(keys.map((key) => `alert:${key}`).sort());
    expect(await dlq.collect()).toHaveLength(keys.length);
    const alerted = await Promise.all(instances.map((app) => gapMetric(app, 'alert')));
    expect(alerted[0] + alerted[1]).toBe(keys.length);
    for (const key of keys) {
      expect(await stateOf(key)).toMatchObject({ next: 1, buffered: [2, 3] });
    }
  });

  it('two instances sweeping the same Redis at once resolve each gap exactly once', async () => {
    const instances = [await start('skip'), await start('skip')];
    const keys = Array.from({ length: 20 }, (_, i) => `K${i}`);
    for (const key of keys) await publish(key, [2]);

    const delivered = () => instances.flatMap((app) => app.handler.received);
    await eventually(() => delivered().length === keys.length, 'every key released', 5_000);
    await dlq.atLeast(keys.length, 'one skip record per key');
    await pause(2 * SWEEP_INTERVAL_MS);

    expect(await dlq.collect()).toHaveLength(keys.length);
    expect(
      instances
        .flatMap((app) => app.gaps)
        .map((gap) => gap.key)
        .sort(),
    ).toEqual([...keys].sort());
    expect(
      delivered()
        .map((event) => `${event.key}:${event.seq}`)
        .sort(),
    ).toEqual(keys.map((key) => `${key}:2`).sort());
    const skipped = await Promise.all(instances.map((app) => gapMetric(app, 'skipped')));
    expect(skipped[0] + skipped[1]).toBe(keys.length);
  });
});
