import { Redis } from 'ioredis';
import { bytes, eventually, makeFragments, type TestFragment } from '../support/sequence-test-app';
import { retainedBufferMemory } from './support/memory';
import { singleMetricValue } from './support/metrics';
import { createRealServersApp, type RealServersApp } from './support/real-servers.app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';
import { keysUnder } from '../support/redis.fixture';

jest.setTimeout(60_000);

const KiB = 1024;
const MiB = 1024 * KiB;

/** Keys of one prefix, by kind, and what the buffered bodies cost Redis. */
interface KeySample {
  /** When the scan started. */
  readonly at: number;
  readonly total: number;
  /** meta, crc and body hashes: the keys of open sequences. */
  readonly meta: number;
  readonly crc: number;
  readonly body: number;
  /** Finished-sequence markers (`done`) and epoch fences. */
  readonly markers: number;
  /** Expiry reports an expire keeps for a resend of its own (at most a minute, never past its marker). */
  readonly reports: number;
  /** The store-wide keys, `{idx}`. */
  readonly global: number;
  /** MEMORY USAGE of every body hash. */
  readonly bodyBytes: number;
  /** sequences_expired_total read right after the scan. */
  readonly expiredAfter: number;
}

async function sampleKeys(
  redis: Redis,
  prefix: string,
  expired: () => Promise<number>,
): Promise<KeySample> {
  const at = Date.now();
  const keys = await keysUnder(redis, prefix);
  const count = (suffix: string) => keys.filter((key) => key.endsWith(suffix)).length;
  const bodies = keys.filter((key) => key.endsWith(':body'));
  const pipeline = redis.pipeline();
  for (const key of bodies) pipeline.memory('USAGE', key);
  const usage = ((await pipeline.exec()) ?? []).map(([, value]) => Number(value ?? 0));
  return {
    at,
    total: keys.length,
    meta: count(':meta'),
    crc: count(':crc'),
    body: bodies.length,
    markers: count(':done') + count(':fence'),
    reports: count(':expire-report'),
    global: keys.filter((key) => key.includes(':{idx}:')).length,
    bodyBytes: usage.reduce((sum, bytes) => sum + bytes, 0),
    expiredAfter: await expired(),
  };
}

/** Every sequence's first fragment of 3 (the rest never comes): narrow and wide ones alternate. */
function firstFragments(count: number, narrowBytes: number, wideBytes: number): TestFragment[] {
  return Array.from({ length: count }, (_, i) => {
    const fragmentBytes = i % 2 === 0 ? narrowBytes : wideBytes;
    return makeFragments(`flood-${i}`, bytes(3 * fragmentBytes, i + 1), fragmentBytes)[0];
  });
}

/**
 * Guarantees table, rows "buffer full" and "missing fragment", under a flood of sequences that
 * never complete, on the real servers.
 */
describeOnRealServers('faults: a flood of never-completing sequences', () => {
  let consumer: RealServersApp | undefined;
  const servers = useFaultServers({
    beforeCleanup: async () => {
      await consumer?.close();
      consumer = undefined;
    },
  });

  async function publishRaw(channel: string, fragments: TestFragment[]): Promise<void> {
    const publisher = await servers.admin.confirmChannel();
    try {
      for (const { body, headers } of fragments) {
        publisher.sendToQueue(channel, body, { headers, persistent: true });
      }
      await publisher.waitForConfirms();
    } finally {
      await publisher.close();
    }
  }

  // 300 sequences against 50 open sequences and 8 MiB: narrow ones declare 3 × 4 KiB, wide ones
  // 3 × 128 KiB (21 of them fill the byte budget), so both limits push back.
  it('keeps Redis keys, buffered bytes and consumer memory bounded, back-pressures the surplus, expires every sequence with a record and leaves no key behind', async () => {
    const limits = { maxOpenSequences: 50, maxBufferedBytes: 8 * MiB };
    const prefetch = 16;
    const timeoutMs = 1_000;
    const retentionMs = 1;
    // The sweeper must reach a due sequence within leaseMs + this (its keys lapse then); it lags
    // ~150 ms behind this flood. Every key's end is waited for: a larger margin only waits longer.
    const keyTtlMarginMs = 2_000;
    const channel = servers.admin.newChannel();
    consumer = await createRealServersApp(channel, {
      prefix: servers.prefix,
      keyTtlMarginMs,
      // Fragments of at most 128 KiB: the prefetch stays 16 (prefetchBytes does not lower it).
      handler: {
        prefetch,
        maxFragmentBytes: 128 * KiB,
        timeoutMs,
        timeoutStrategy: 'fixed',
      },
      // One channel: its budget is the store's.
      sequence: {
        ...limits,
        maxChannelBufferedBytes: limits.maxBufferedBytes,
        maxSequenceBytes: 3 * 128 * KiB,
        retentionMs,
      },
      tuning: { leaseMs: 100, sweepers: { expiry: { intervalMs: 100 } }, backpressureDelayMs: 250 },
    });
    const firsts = firstFragments(300, 4 * KiB, 128 * KiB);
    const floodBytes = firsts.reduce((sum, { body }) => sum + body.length, 0);
    const registry = consumer.metrics.registry;
    const expired = () =>
      singleMetricValue(registry, 'nest_sequence_sequences_expired_total', { channel });
    const memory = retainedBufferMemory();
    const baseline = await memory();

    const keySamples: KeySample[] = [];
    const memorySamples: number[] = [];
    const peaks = { openSequences: 0, bufferedBytes: 0, sweeperLagMs: 0 };
    let flooding = true;
    let published = false;
    const sampling = (async () => {
      for (let turn = 0; flooding; turn++) {
        keySamples.push(await sampleKeys(servers.redis, servers.prefix, expired));
        const now = Date.now();
        const stats = await consumer.store.stats(now);
        peaks.openSequences = Math.max(peaks.openSequences, stats.openSequences);
        peaks.bufferedBytes = Math.max(peaks.bufferedBytes, stats.bufferedBytes);
        // How long past its deadline the oldest open sequence waits for the sweeper.
        const lag = stats.oldestOpenAt === undefined ? 0 : now - stats.oldestOpenAt - timeoutMs;
        peaks.sweeperLagMs = Math.max(peaks.sweeperLagMs, lag);
        // Only once published: until then the publisher (this process too) buffers the flood.
        if (published && turn % 10 === 0) memorySamples.push((await memory()) - baseline);
        await new Promise((resolve) => setTimeout(resolve, 150));
      }
    })();
    try {
      await publishRaw(channel, firsts);
      published = true;
      await eventually(async () => (await expired()) === firsts.length, 'all expired', 45_000);
    } catch (error) {
      // A sequence whose keys expire before the sweeper reaches it is never reported (see the
      // last test): say whether that is what happened.
      throw new Error(
        `${(error as Error).message}: ${await expired()} expired; the sweeper lagged up to ` +
          `${peaks.sweeperLagMs} ms behind deadlines, keys live ${100 + keyTtlMarginMs} ms past them`,
      );
    } finally {
      flooding = false;
      await sampling;
    }

    // Bounded while it lasted. Open sequences: at most maxOpenSequences, 3 keys each. Markers: a
    // finished sequence's marker lives retentionMs + keyTtlMarginMs after its expiry, and the
    // expiry is counted after the marker is written, so the markers a scan sees belong to
    // sequences counted since that long before the scan (plus the sweep batch being reported).
    const countedBy = (time: number) =>
      Math.max(0, ...keySamples.filter((s) => s.at <= time).map((s) => s.expiredAfter));
    const markerWindow = retentionMs + keyTtlMarginMs + 250;
    const overBound = keySamples.filter((s) => {
      // A sweep claims every due sequence of its batch (at most maxOpenSequences are open) before
      // it reports any of them: that many markers may precede their reports.
      const markerBound = s.expiredAfter + limits.maxOpenSequences - countedBy(s.at - markerWindow);
      return (
        s.meta > limits.maxOpenSequences ||
        s.crc > limits.maxOpenSequences ||
        s.body > limits.maxOpenSequences ||
        s.global > 6 ||
        s.markers > markerBound ||
        s.reports > markerBound ||
        s.total > 3 * limits.maxOpenSequences + 2 * markerBound + 6
      );
    });
    expect(keySamples.length).toBeGreaterThan(20);
    expect(overBound).toEqual([]);
    expect(Math.max(...keySamples.map((s) => s.meta))).toBeGreaterThan(0);
    expect(peaks.openSequences).toBeLessThanOrEqual(limits.maxOpenSequences);
    expect(peaks.bufferedBytes).toBeLessThanOrEqual(limits.maxBufferedBytes);
    expect(Math.max(...keySamples.map((s) => s.bodyBytes))).toBeLessThanOrEqual(
      limits.maxBufferedBytes,
    );
    // The consumer holds the bodies of at most `prefetch` messages (plus its sockets' buffers);
    // had it kept the flood, it would be over the bound.
    const retainedBound = prefetch * 128 * KiB + 4 * MiB;
    expect(floodBytes).toBeGreaterThan(retainedBound * 1.5);
    expect(Math.max(...memorySamples)).toBeLessThan(retainedBound);

    // Held back, not refused: both limits pushed back; nothing was dead-lettered but the expiry
    // records, one per sequence.
    for (const limit of ['maxOpenSequences', 'maxBufferedBytes']) {
      const backpressure = await singleMetricValue(registry, 'nest_sequence_backpressure_total', {
        channel,
        limit,
      });
      expect({ limit, pushedBack: backpressure > 0 }).toEqual({ limit, pushedBack: true });
    }
    await eventually(
      async () => (await servers.admin.readyCount(`${channel}.dlq`)) === firsts.length,
      'the expiry records',
    );
    const expiredIds = new Set<string>();
    for (const record of await servers.admin.drain(`${channel}.dlq`)) {
      const body = JSON.parse(record.body.toString()) as Record<string, unknown>;
      expect(body).toMatchObject({
        kind: 'sequence-expired',
        receivedPositions: [1],
        missingPositions: [2, 3],
        size: 3,
      });
      expiredIds.add(String(body.sequenceId));
    }
    expect(expiredIds.size).toBe(firsts.length);
    expect(await servers.admin.readyCount(channel)).toBe(0);

    // And then gone. First every key of a sequence (markers live retentionMs + keyTtlMarginMs);
    // then the store-wide keys, which outlive them by design: their TTL, set by the last
    // reservation, is at most timeout + lease + 2 × keyTtlMarginMs.
    await eventually(
      async () =>
        (await keysUnder(servers.redis, servers.prefix)).every((key) => key.includes(':{idx}:')),
      'no key of any sequence left',
      retentionMs + keyTtlMarginMs + 2_000,
    );
    const globalTtlBound = timeoutMs + 100 + 2 * keyTtlMarginMs;
    for (const key of await keysUnder(servers.redis, servers.prefix)) {
      const ttl = await servers.redis.pttl(key); // -1: no TTL at all; -2: gone meanwhile
      if (ttl === -2) continue;
      expect({ key, expiresInTime: ttl > 0 && ttl <= globalTtlBound }).toEqual({
        key,
        expiresInTime: true,
      });
    }
    await eventually(
      async () => (await keysUnder(servers.redis, servers.prefix)).length === 0,
      'no key left under the prefix',
      globalTtlBound + 1_000,
    );
  });

  // A sequence's keys expire leaseMs + keyTtlMarginMs after its deadline, so the sweeper must
  // reach every due sequence within that margin. It claims a whole batch of due sequences at
  // once and publishes their records at once; the sweeper that claimed them one at a time,
  // awaiting each record's confirm, fell ~3.4 s behind this flood and let most of it vanish
  // unreported (3 of 300 in one run).
  it('reports every one of a flood of expiring sequences before their keys lapse', async () => {
    const channel = servers.admin.newChannel();
    const onExpired = jest.fn();
    consumer = await createRealServersApp(channel, {
      prefix: servers.prefix,
      keyTtlMarginMs: 1_500,
      handler: {
        timeoutMs: 300,
        timeoutStrategy: 'fixed',
      },
      tuning: { leaseMs: 100, sweepers: { expiry: { intervalMs: 100 } } },
      sequence: { retentionMs: 1, onExpired },
    });
    const registry = consumer.metrics.registry;
    const counter = (name: string) => singleMetricValue(registry, name, { channel });
    const firsts = firstFragments(300, 1 * KiB, 1 * KiB);
    await publishRaw(channel, firsts);
    await eventually(
      async () => (await counter('nest_sequence_sequences_started_total')) === firsts.length,
      'every sequence opened',
      10_000,
    );
    await eventually(
      async () => (await keysUnder(servers.redis, servers.prefix)).length === 0,
      'every key gone',
      10_000,
    );

    await consumer.sweeper.sweep(); // joins a sweep in progress, so its reports are all out

    // All 300 opened, are gone from Redis, and were reported, once each.
    expect(await counter('nest_sequence_sequences_expired_total')).toBe(firsts.length);
    expect(onExpired).toHaveBeenCalledTimes(firsts.length);
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(firsts.length);
    expect(consumer.handler.calls).toBe(0);
  });
});
