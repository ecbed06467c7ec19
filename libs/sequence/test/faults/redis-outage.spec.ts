import { Redis, type RedisOptions } from 'ioredis';
import { RedisSequenceStore } from 'nest-sequence/redis';
import {
  bytes,
  eventually,
  makeFragments,
  publishAll,
  type TestFragment,
} from '../support/sequence-test-app';
import { singleMetricValue } from './support/metrics';
import { OwnedRedisServer } from '../support/processes/owned-redis.server';
import { RabbitMqAdmin } from '../support/rabbitmq.fixture';
import { createRealServersApp, type RealServersApp } from './support/real-servers.app';
import { describeOnRealServers } from './support/real-servers';
import { crcKey, newPrefix } from '../support/redis.fixture';

jest.setTimeout(30_000);

/**
 * The consumer's ioredis settings for an outage: fail a command at once while disconnected
 * (no offline queue, one retry), give up on a server that hangs (`commandTimeout`), and keep
 * reconnecting quickly. Without them a command waits in ioredis's queue while Redis is away, and
 * the fragment it carries stays in the consumer's hands instead of being requeued.
 */
const FAIL_FAST: RedisOptions = {
  maxRetriesPerRequest: 1,
  enableOfflineQueue: false,
  connectTimeout: 500,
  commandTimeout: 500,
  retryStrategy: (attempt) => Math.min(50 * attempt, 200),
};

/**
 * Guarantees table, row "store unreachable", against a redis-server the test owns: stopped
 * (SIGKILL) and restarted on the same port, or frozen (SIGSTOP) and resumed, in the middle of a
 * sequence.
 */
describeOnRealServers('faults: Redis stopped in the middle of a sequence', () => {
  let admin: RabbitMqAdmin;
  let server: OwnedRedisServer | undefined;
  let client: Redis | undefined;
  let app: RealServersApp | undefined;

  beforeAll(async () => {
    admin = await RabbitMqAdmin.connect();
  });

  afterEach(async () => {
    await app?.close();
    client?.disconnect();
    await server?.dispose();
    await admin.cleanup();
    app = client = server = undefined;
  });

  afterAll(async () => {
    await admin.close();
  });

  /** A consumer on `server`, with the first half of a 6-fragment sequence stored and acked. */
  async function halfStored(options: {
    appendOnly: boolean;
    leaseMs?: number;
    /** `false`: the test runs the sweeper itself. */
    sweepIntervalMs?: number | false;
    /**
     * Wait until the broker holds none of the stored fragments (rabbitmqctl: ~1 s a look). A
     * fragment is acked only after every step of the store's accept; one stored by the first step
     * but not yet acked is redelivered after an outage, and stored again if Redis lost it.
     */
    waitAcked?: boolean;
  }) {
    server = await OwnedRedisServer.start({ appendOnly: options.appendOnly });
    const channel = admin.newChannel();
    const prefix = newPrefix();
    client = new Redis(server.url, FAIL_FAST);
    await eventually(() => client!.status === 'ready', 'the consumer connected to Redis');
    app = await createRealServersApp(channel, {
      prefix,
      store: new RedisSequenceStore(client, { prefix }),
      handler: {
        timeoutMs: 60_000,
      },
      tuning: {
        backpressureDelayMs: 100,
        sweepers: { expiry: { intervalMs: options.sweepIntervalMs ?? 100 } },
        leaseMs: options.leaseMs,
      },
    });
    const payload = bytes(96_000, 91);
    const fragments = makeFragments('outage', payload, 16_000);
    await publishAll(app.transport, channel, fragments.slice(0, 3));
    await eventually(
      async () => (await client!.hlen(crcKey(prefix, channel, 'outage'))) === 3,
      'the first 3 fragments stored',
    );
    if (options.waitAcked) {
      await eventually(async () => {
        const { ready, unacked } = await admin.totalCount(channel);
        return ready + unacked === 0;
      }, 'the stored fragments acked');
    }
    return { app, channel, prefix, payload, fragments, server };
  }

  /**
   * With the store gone, the rest of the sequence is published: every fragment is taken and put
   * back (requeued behind the queue, after backpressureDelayMs), none is acked, dead-lettered or
   * delivered.
   */
  async function publishTheRestDuringTheOutage(
    t: RealServersApp,
    channel: string,
    fragments: TestFragment[],
  ): Promise<void> {
    // This counter alone: a whole-registry scrape reads the store's stats, which wait up to a
    // second each while it is down.
    const received = () =>
      singleMetricValue(t.metrics.registry, 'nest_sequence_fragments_received_total', { channel });
    const before = await received();
    await publishAll(t.transport, channel, fragments.slice(3));
    await eventually(
      async () => (await received()) >= before + 3 * 3,
      'each one tried 3 times',
      10_000,
    );
    const { ready, unacked } = await admin.totalCount(channel);
    // Each of the 3 is in the queue or in the consumer's hands; during a requeue, its copy at the
    // tail and the original can both be counted for a moment.
    expect(ready + unacked).toBeGreaterThanOrEqual(3);
    expect(ready + unacked).toBeLessThanOrEqual(6);
    expect(await admin.readyCount(`${channel}.dlq`)).toBe(0);
    expect(t.handler.calls).toBe(0);
  }

  it('requeues every fragment while Redis is down, acks none unstored, and completes the sequence once after Redis restarts with its append-only file', async () => {
    const { channel, payload, fragments } = await halfStored({
      appendOnly: true,
      waitAcked: true,
    });

    await server!.stop('SIGKILL');
    await publishTheRestDuringTheOutage(app!, channel, fragments);
    await server!.restart();

    await eventually(() => app!.handler.deliveries.length === 1, 'the sequence delivered', 10_000);
    await eventually(async () => (await admin.readyCount(channel)) === 0, 'the queue drained');
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(app!.handler.calls).toBe(1);
    expect(app!.handler.of('outage')[0].bytes.equals(payload)).toBe(true);
    expect(await admin.totalCount(channel)).toEqual({ ready: 0, unacked: 0 });
    expect(await admin.readyCount(`${channel}.dlq`)).toBe(0);
  });

  it('requeues every fragment while Redis hangs (SIGSTOP), and completes the sequence once after it resumes', async () => {
    // A short lease: see the next test for why it matters after a hang.
    const { channel, payload, fragments } = await halfStored({ appendOnly: false, leaseMs: 1_000 });

    server!.pause();
    await publishTheRestDuringTheOutage(app!, channel, fragments);
    server!.resume();

    await eventually(() => app!.handler.deliveries.length === 1, 'the sequence delivered', 10_000);
    await eventually(async () => (await admin.readyCount(channel)) === 0, 'the queue drained');
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(app!.handler.calls).toBe(1);
    expect(app!.handler.of('outage')[0].bytes.equals(payload)).toBe(true);
    expect(await admin.readyCount(`${channel}.dlq`)).toBe(0);
  });

  // While Redis hangs, each accept fails on the client (commandTimeout) and the fragment is
  // requeued, but the command is still in Redis's input buffer. On resume Redis runs them all; the
  // one that stores the last missing fragment gives the completion lease to a delivery that gave
  // up long ago. The aggregator releases the lease of every failed accept right after it (the
  // release runs behind the late accept on the same connection), so the sequence is delivered
  // within moments of the resume instead of after leaseMs.
  it('after a hang, delivers a sequence completed by a timed-out accept without waiting out its lease', async () => {
    const leaseMs = 20_000;
    const { channel, fragments, payload } = await halfStored({ appendOnly: false, leaseMs });

    server!.pause();
    await publishTheRestDuringTheOutage(app!, channel, fragments);
    const resumedAt = Date.now();
    server!.resume();

    await eventually(
      () => app!.handler.deliveries.length === 1,
      'the delivery after the resume',
      10_000,
    );
    expect(app!.handler.calls).toBe(1);
    expect(Date.now() - resumedAt).toBeLessThan(leaseMs / 2);
    expect(app!.handler.of('outage')[0].bytes.equals(payload)).toBe(true);
    expect(await admin.readyCount(`${channel}.dlq`)).toBe(0);
  });

  // The three gauges read store.stats() when scraped. While the store is down they keep their last
  // value and the scrape succeeds, so the counters that show the outage stay readable during it.
  it('keeps metrics scrapeable while Redis is down, counting the failed stats reads', async () => {
    const { channel } = await halfStored({ appendOnly: false });
    // While Redis answers: the half-stored sequence is open.
    const before = await app!.metrics.registry.metrics();
    expect(before).toMatch(/^nest_sequence_open_sequences 1$/m);
    const buffered = /^nest_sequence_buffered_bytes (\d+)$/m.exec(before)?.[1];
    expect(Number(buffered)).toBeGreaterThan(0);
    await server!.stop('SIGKILL');

    // The failure counter is serialized alongside the gauges, so the first scrape may still show
    // 0; the second shows the first scrape's failed read.
    await app!.metrics.registry.metrics();
    const scrape = await app!.metrics.registry.metrics();
    // The values read before the outage, not 0.
    expect(scrape).toMatch(/^nest_sequence_open_sequences 1$/m);
    expect(scrape).toMatch(new RegExp(`^nest_sequence_buffered_bytes ${buffered}$`, 'm'));
    expect(scrape).toMatch(/nest_sequence_store_stats_failures_total [1-9]/);
    expect(
      await singleMetricValue(app!.metrics.registry, 'nest_sequence_fragments_received_total', {
        channel,
      }),
    ).toBe(3);
  });

  // What a Redis without persistence costs: the fragments it acknowledged are gone after a
  // restart, and so is any hope for that sequence. The fragments sent afterwards open it anew,
  // and it expires, naming the positions that were lost.
  it('cannot complete a sequence whose stored fragments a restart without persistence lost: it expires with an expiry record naming them', async () => {
    const { channel, fragments, prefix } = await halfStored({
      appendOnly: false,
      waitAcked: true,
      sweepIntervalMs: false,
    });

    await server!.stop('SIGKILL');
    await publishTheRestDuringTheOutage(app!, channel, fragments);
    await server!.restart();
    await eventually(
      async () => (await client!.hlen(crcKey(prefix, channel, 'outage')).catch(() => 0)) === 3,
      'the rest stored in the empty Redis',
      10_000,
    );
    // A minute later (the timeout), as the sweeper would see it.
    expect(await app!.sweeper.sweep(Date.now() + 61_000)).toBe(1);

    await eventually(
      async () => (await admin.readyCount(`${channel}.dlq`)) === 1,
      'the expiry record',
    );
    const [record] = await admin.drain(`${channel}.dlq`);
    expect(String(record.headers['x-death-reason'])).toMatch(/^sequence-expired: sequence outage /);
    expect(JSON.parse(record.body.toString())).toMatchObject({
      kind: 'sequence-expired',
      channel,
      sequenceId: 'outage',
      receivedPositions: [4, 5, 6],
      missingPositions: [1, 2, 3],
      size: 6,
    });
    expect(app!.handler.calls).toBe(0);
    expect(await client!.hlen(crcKey(prefix, channel, 'outage'))).toBe(0);
    expect(await admin.readyCount(channel)).toBe(0);
  });
});
