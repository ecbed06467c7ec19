import { storedChargeOf } from 'nest-sequence/testing';
import { FRAGMENT_OVERHEAD_BYTES } from '../../src/core/completeness';
import { Registry } from 'prom-client';
import { MemorySequenceStore } from 'nest-sequence';
import { sha256Hex } from '../../src/core/checksum';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  eventually,
  makeFragments,
  metricValue,
  publishAll,
  type SequenceTestApp,
} from '../support/sequence-test-app';

/**
 * The metrics the guarantees table promises ("counted", "metric"), after one mixed run on the
 * embedded defaults, read from a prom-client Registry the user passed in.
 */
describe('guarantees: metrics', () => {
  describe('after a mixed run', () => {
    const channel = 'guarantees.metrics.mixed';
    const registry = new Registry();
    let t: SequenceTestApp;
    /** Bounds of the arrival time of the one sequence left open. */
    let openSince: { earliest: number; latest: number };

    /**
     * - `done`: 3 fragments, the first one twice, then a late duplicate: completed, 2 duplicates;
     * - `too-big`: declares 8,000 bytes over a 5,000-byte limit: each fragment dead-lettered
     *   sequence-too-large; never started, nothing kept of it;
     * - `forged`: 2 fragments with a wrong SHA-256: started, rejected (integrity-mismatch), its
     *   2,000 bytes retained for inspection;
     * - `gone`: 1 of 3 fragments, then expired by a sweep;
     * - `open`: 1 of 2 fragments, left open.
     * Every fragment body is 1,000 bytes: 11 fragments, 11,000 bytes.
     */
    beforeAll(async () => {
      t = await createSequenceTestApp(channel, {
        metrics: { registry },
        handler: { maxSequenceBytes: 5_000, timeoutMs: 1_000 },
      });
      const done = makeFragments('done', bytes(3_000, 91), 1_000);
      const tooBig = makeFragments('too-big', bytes(8_000, 92), 1_000);
      const forged = makeFragments('forged', bytes(2_000, 93), 1_000);
      forged[1] = {
        body: forged[1].body,
        headers: { ...forged[1].headers, 'x-sequence-sha256': sha256Hex(bytes(2_000, 94)) },
      };
      const gone = makeFragments('gone', bytes(3_000, 95), 1_000);
      const open = makeFragments('open', bytes(2_000, 96), 1_000);

      await publishAll(t.transport, channel, [done[0], done[0], done[1], done[2]]);
      await publishAll(t.transport, channel, [tooBig[0], tooBig[1], ...forged]);
      await t.transport.whenIdle();
      await publishAll(t.transport, channel, [done[1], gone[0]]);
      await t.transport.whenIdle();
      const goneAt = (await t.store.stats(Date.now())).oldestOpenAt!;
      expect(await t.sweeper.sweep(goneAt + 1_000)).toBe(1);

      const earliest = Date.now();
      await publishAll(t.transport, channel, [open[0]]);
      await t.transport.whenIdle();
      openSince = { earliest, latest: Date.now() };
      await eventually(() => Date.now() >= openSince.latest + 25, 'the open sequence to age');

      expect(t.handler.calls).toBe(1);
      expect(deadLetters(t.transport, channel)).toHaveLength(4); // too-big ×2, forged, gone's record
    });
    afterAll(() => t.close());

    const value = (name: string, labels: Record<string, string> = {}) =>
      metricValue(registry, `nest_sequence_${name}`, labels);

    it('is registered in the registry the user passed', () => {
      expect(t.metrics.registry).toBe(registry);
    });

    it('counts sequences started, completed, rejected (by reason) and expired', async () => {
      expect(await value('sequences_started_total', { channel })).toBe(4);
      expect(await value('sequences_completed_total', { channel })).toBe(1);
      expect(
        await value('sequences_rejected_total', { channel, reason: 'integrity-mismatch' }),
      ).toBe(1);
      expect(await value('sequences_rejected_total', { channel })).toBe(1);
      expect(await value('sequences_expired_total', { channel })).toBe(1);
    });

    it('counts duplicate fragments, including late ones', async () => {
      expect(await value('duplicate_fragments_total', { channel })).toBe(2);
    });

    it('counts every fragment received and its body bytes', async () => {
      expect(await value('fragments_received_total', { channel })).toBe(11);
      expect(await value('bytes_received_total', { channel })).toBe(11_000);
    });

    it('counts fragments dead-lettered on their own account, by reason', async () => {
      expect(
        await value('fragments_rejected_total', { channel, reason: 'sequence-too-large' }),
      ).toBe(2);
      expect(await value('fragments_rejected_total', { channel })).toBe(2);
    });

    it('reports open sequences and buffered bytes from the store (retained failed fragments included)', async () => {
      expect(await value('open_sequences')).toBe(1);
      // The open sequence's first fragment, and the rejected one's two kept for inspection.
      expect(await value('buffered_bytes')).toBe(
        storedChargeOf(1_000) + storedChargeOf(1_000, 1_000),
      );
      // The open sequence's second fragment, declared and not there yet.
      expect(await value('reserved_bytes')).toBe(FRAGMENT_OVERHEAD_BYTES + 1_000);
    });

    it('reports the age of the oldest open sequence in seconds', async () => {
      const before = Date.now();
      const age = await value('oldest_open_age_seconds');
      const after = Date.now();

      expect(age).toBeGreaterThanOrEqual((before - openSince.latest) / 1_000);
      expect(age).toBeLessThanOrEqual((after - openSince.earliest) / 1_000);
      expect(age).toBeGreaterThanOrEqual(0.025);
    });

    it('observes one reassembly latency per delivered sequence', async () => {
      expect(await value('reassembly_latency_seconds_count', { channel })).toBe(1);
      const seconds = await value('reassembly_latency_seconds_sum', { channel });
      expect(seconds).toBeGreaterThanOrEqual(0);
      expect(seconds).toBeLessThan(5);
    });
  });

  it('reports no open sequence, no buffered byte and an oldest open age of 0 when the store is empty', async () => {
    const t = await createSequenceTestApp('guarantees.metrics.empty');
    try {
      const registry = t.metrics.registry;
      expect(await metricValue(registry, 'nest_sequence_open_sequences')).toBe(0);
      expect(await metricValue(registry, 'nest_sequence_buffered_bytes')).toBe(0);
      expect(await metricValue(registry, 'nest_sequence_oldest_open_age_seconds')).toBe(0);
    } finally {
      await t.close();
    }
  });

  it('answers a scrape while the store does not answer: the gauges keep their value, the failure is counted', async () => {
    const channel = 'guarantees.metrics.hung-store';
    const store = new MemorySequenceStore();
    const t = await createSequenceTestApp(channel, {
      sequence: { store },
    });
    try {
      const registry = t.metrics.registry;
      // One sequence left open (1 of 2 fragments), read by a scrape while the store answers.
      await publishAll(
        t.transport,
        channel,
        makeFragments('open', bytes(2_000, 99), 1_000).slice(0, 1),
      );
      await t.transport.whenIdle();
      expect(await metricValue(registry, 'nest_sequence_open_sequences')).toBe(1);
      const buffered = await metricValue(registry, 'nest_sequence_buffered_bytes');
      expect(buffered).toBe(storedChargeOf(1_000));
      // A server that stopped answering: the call never settles.
      let reads = 0;
      store.stats = () => {
        reads++;
        return new Promise(() => undefined);
      };
      await new Promise((resolve) => setImmediate(resolve)); // past the scrape that read it last

      const scrape = await registry.metrics();
      await new Promise((resolve) => setImmediate(resolve));
      await registry.metrics();

      // The values of the last scrape that read the store, not 0.
      expect(scrape).toMatch(/^nest_sequence_open_sequences 1$/m);
      expect(scrape).toMatch(new RegExp(`^nest_sequence_buffered_bytes ${buffered}$`, 'm'));
      // Two scrapes timed out waiting on one read: a slow store is not asked again meanwhile.
      expect(reads).toBe(1);
      expect(
        await metricValue(registry, 'nest_sequence_store_stats_failures_total'),
      ).toBeGreaterThanOrEqual(2);
    } finally {
      await t.close();
    }
  });

  it('names the metrics with the prefix the user chose', async () => {
    const channel = 'guarantees.metrics.prefix';
    const registry = new Registry();
    const t = await createSequenceTestApp(channel, { metrics: { registry, prefix: 'imaging_' } });
    try {
      await publishAll(t.transport, channel, makeFragments('prefixed', bytes(1_500, 97), 1_000));
      await t.transport.whenIdle();

      expect(await registry.getSingleMetricAsString('imaging_sequences_completed_total')).toContain(
        `imaging_sequences_completed_total{channel="${channel}"} 1`,
      );
      expect(registry.getSingleMetric('nest_sequence_sequences_completed_total')).toBeUndefined();
    } finally {
      await t.close();
    }
  });

  it("takes its metrics out of a registry of the application's own at shutdown, so the next application can use it", async () => {
    const channel = 'guarantees.metrics.shared-registry';
    const registry = new Registry();
    const first = await createSequenceTestApp(channel, { metrics: { registry } });
    expect(registry.getSingleMetric('nest_sequence_open_sequences')).toBeDefined();
    expect(registry.getSingleMetric('nest_sequence_outbox_published_total')).toBeDefined();
    await first.close();
    expect(await registry.getMetricsAsJSON()).toEqual([]);

    const second = await createSequenceTestApp(channel, { metrics: { registry } });
    try {
      await publishAll(second.transport, channel, makeFragments('again', bytes(1_500, 96), 1_000));
      await second.transport.whenIdle();
      expect(
        await metricValue(registry, 'nest_sequence_sequences_completed_total', { channel }),
      ).toBe(1);
    } finally {
      await second.close();
    }
  });

  it('registers nothing when metrics are disabled', async () => {
    const channel = 'guarantees.metrics.off';
    const t = await createSequenceTestApp(channel, { metrics: false });
    try {
      await publishAll(t.transport, channel, makeFragments('unmetered', bytes(1_500, 98), 1_000));
      await t.transport.whenIdle();

      expect(t.handler.calls).toBe(1);
      expect(await t.metrics.registry.getMetricsAsJSON()).toEqual([]);
    } finally {
      await t.close();
    }
  });
});
