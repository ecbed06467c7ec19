import { storedChargeOf } from 'nest-sequence/testing';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  deathReasonOf,
  eventually,
  makeFragments,
  makeStreamingFragments,
  metricValue,
  publishAll,
  type SequenceTestApp,
} from '../support/sequence-test-app';
import { sampleStats } from './instrumented.sequence-store';

const MiB = 1024 * 1024;

/**
 * Guarantees table, rows "sequence over maxSequenceBytes / maxFragments" and "buffer full
 * (maxBufferedBytes, maxOpenSequences)", on the embedded defaults.
 */
describe('guarantees: limits and back-pressure', () => {
  let t: SequenceTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  const stats = (app: SequenceTestApp) => app.store.stats(Date.now());
  const reasons = (app: SequenceTestApp, channel: string) =>
    deadLetters(app.transport, channel).map((m) => deathReasonOf(m).split(':')[0]);

  describe('a sequence over maxSequenceBytes', () => {
    const channel = (name: string) => `guarantees.limits.bytes.${name}`;
    /** A streamed sequence of 5 × 1,000 bytes (no declared total) against a 2,500-byte limit. */
    async function overTheLimit(name: string) {
      t = await createSequenceTestApp(channel(name), { handler: { maxSequenceBytes: 2_500 } });
      const payload = bytes(5_000, 31);
      const fragments = makeStreamingFragments('too-big', payload, 1_000);
      await publishAll(t.transport, channel(name), fragments.slice(0, 2));
      await t.transport.whenIdle();
      return { app: t, fragments };
    }

    it('is refused at the fragment that breaks the limit (sequence-too-large) and its buffer is released', async () => {
      const { app, fragments } = await overTheLimit('released');
      expect(await stats(app)).toMatchObject({
        openSequences: 1,
        bufferedBytes: storedChargeOf(1_000, 1_000),
      });

      await publishAll(app.transport, channel('released'), [fragments[2]]);
      await app.transport.whenIdle();

      const dead = deadLetters(app.transport, channel('released'));
      expect(dead).toHaveLength(1);
      expect(deathReasonOf(dead[0])).toMatch(/^sequence-too-large: sequence too-big fragment 3: /);
      expect(dead[0].body.equals(fragments[2].body)).toBe(true);
      expect(await stats(app)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
      expect(app.handler.calls).toBe(0);
      expect(
        await metricValue(app.metrics.registry, 'nest_sequence_sequences_rejected_total', {
          channel: channel('released'),
          reason: 'sequence-too-large',
        }),
      ).toBe(1);
    });

    it('has its later fragments dead-lettered sequence-rejected', async () => {
      const { app, fragments } = await overTheLimit('later');
      await publishAll(app.transport, channel('later'), fragments.slice(2));
      await app.transport.whenIdle();

      expect(reasons(app, channel('later'))).toEqual([
        'sequence-too-large',
        'sequence-rejected',
        'sequence-rejected',
      ]);
      expect(await stats(app)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
      expect(app.handler.calls).toBe(0);
    });

    it('is refused (sequence-too-large) once a streamed one outgrows its channel budget, not requeued until it expires', async () => {
      // The handler allows 8 MiB, its channel may hold 6 MiB (three quarters of the module's
      // budget): a 7 MiB stream can never be buffered whole.
      const name = channel('outgrown');
      t = await createSequenceTestApp(name, {
        sequence: { maxBufferedBytes: 8 * MiB, maxSequenceBytes: MiB },
        handler: { maxSequenceBytes: 8 * MiB },
      });
      const fragments = makeStreamingFragments('outgrown', bytes(7 * MiB, 37), MiB / 2);
      await publishAll(t.transport, name, fragments);

      const app = t;
      await eventually(() => deadLetters(app.transport, name).length === 3, 'three dead letters');
      expect(reasons(t, name)).toEqual([
        'sequence-too-large',
        'sequence-rejected',
        'sequence-rejected',
      ]);
      expect(deathReasonOf(deadLetters(t.transport, name)[0])).toMatch(
        /^sequence-too-large: sequence outgrown fragment 12: .*maxChannelBufferedBytes \(6291456\)/,
      );
      await t.transport.whenIdle();
      expect(await stats(t)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
      expect(t.handler.calls).toBe(0);
    });

    it('is refused at each fragment when it declares more bytes than allowed, keeping nothing', async () => {
      t = await createSequenceTestApp(channel('declared'), {
        handler: { maxSequenceBytes: 2_500 },
      });
      const fragments = makeFragments('declared-too-big', bytes(5_000, 32), 1_000);

      await publishAll(t.transport, channel('declared'), fragments);
      await t.transport.whenIdle();

      // Nothing was stored, so no marker is kept either: each fragment is refused on its own.
      expect(reasons(t, channel('declared'))).toEqual(Array<string>(5).fill('sequence-too-large'));
      expect(await stats(t)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
      expect(t.handler.calls).toBe(0);
    });
  });

  describe('user headers over maxHeaderBytes', () => {
    const channel = 'guarantees.limits.headers';

    it('are refused (headers-too-large) before anything is stored; headers within it are charged', async () => {
      t = await createSequenceTestApp(channel, { handler: { maxHeaderBytes: 1_000 } });
      const heavy = makeFragments('heavy', bytes(2_000, 35), 1_000, {
        'x-note': 'n'.repeat(1_000),
      });
      const light = makeFragments('light', bytes(2_000, 36), 1_000, { 'x-note': 'n'.repeat(900) });

      await publishAll(t.transport, channel, [...heavy, light[0]]);
      await t.transport.whenIdle();

      expect(reasons(t, channel)).toEqual(['headers-too-large', 'headers-too-large']);
      expect(deathReasonOf(deadLetters(t.transport, channel)[0])).toMatch(
        /over maxHeaderBytes \(1000\)/,
      );
      const kept = Buffer.byteLength(JSON.stringify({ 'x-note': 'n'.repeat(900) }));
      expect(await stats(t)).toMatchObject({
        openSequences: 1,
        bufferedBytes: storedChargeOf(1_000) - 2 + kept,
      });
      expect(t.handler.calls).toBe(0);
    });
  });

  describe('a sequence over maxFragments', () => {
    const channel = (name: string) => `guarantees.limits.fragments.${name}`;

    it('is refused at the position that breaks the limit (too-many-fragments), its buffer released and later fragments dead-lettered sequence-rejected', async () => {
      t = await createSequenceTestApp(channel('streamed'), { handler: { maxFragments: 3 } });
      const fragments = makeStreamingFragments('too-many', bytes(5_000, 33), 1_000);
      await publishAll(t.transport, channel('streamed'), fragments.slice(0, 3));
      await t.transport.whenIdle();
      expect(await stats(t)).toMatchObject({
        openSequences: 1,
        bufferedBytes: storedChargeOf(1_000, 1_000, 1_000),
      });

      await publishAll(t.transport, channel('streamed'), [fragments[3]]);
      await t.transport.whenIdle();
      expect(reasons(t, channel('streamed'))).toEqual(['too-many-fragments']);
      expect(await stats(t)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });

      await publishAll(t.transport, channel('streamed'), [fragments[4]]);
      await t.transport.whenIdle();
      expect(reasons(t, channel('streamed'))).toEqual(['too-many-fragments', 'sequence-rejected']);
      expect(t.handler.calls).toBe(0);
      expect(
        await metricValue(t.metrics.registry, 'nest_sequence_sequences_rejected_total', {
          channel: channel('streamed'),
          reason: 'too-many-fragments',
        }),
      ).toBe(1);
    });

    it('is refused at each fragment when its declared size is over the limit, keeping nothing', async () => {
      t = await createSequenceTestApp(channel('declared'), { handler: { maxFragments: 3 } });
      const fragments = makeFragments('declared-too-many', bytes(5_000, 34), 1_000);

      await publishAll(t.transport, channel('declared'), fragments);
      await t.transport.whenIdle();

      expect(reasons(t, channel('declared'))).toEqual(Array<string>(5).fill('too-many-fragments'));
      expect(await stats(t)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
      expect(t.handler.calls).toBe(0);
    });
  });

  describe('back-pressure', () => {
    const backpressured = (app: SequenceTestApp, channel: string, limit: string) =>
      metricValue(app.metrics.registry, 'nest_sequence_backpressure_total', { channel, limit });

    it('at maxBufferedBytes requeues a new sequence without storing it, and lets it complete once the earlier one did', async () => {
      const channel = 'guarantees.backpressure.bytes';
      t = await createSequenceTestApp(channel, {
        sequence: { maxBufferedBytes: 10_000, maxSequenceBytes: 10_000 },
      });
      const first = bytes(6_000, 35);
      const second = bytes(6_000, 36);
      const firstFragments = makeFragments('first', first, 1_000);
      const secondFragments = makeFragments('second', second, 1_000);
      await publishAll(t.transport, channel, firstFragments.slice(0, 5));
      await t.transport.whenIdle();
      const storedFive = storedChargeOf(...Array<number>(5).fill(1_000));
      expect(await stats(t)).toMatchObject({ openSequences: 1, bufferedBytes: storedFive });
      const sampler = sampleStats(t.store);

      // 'first' reserves its declared 6,000 bytes: 'second' needs 6,000 more, over 10,000.
      await publishAll(t.transport, channel, secondFragments);
      await eventually(
        async () => (await backpressured(t!, channel, 'maxBufferedBytes')) >= 12,
        'each fragment of the second sequence back-pressured twice',
      );

      expect(await stats(t)).toMatchObject({ openSequences: 1, bufferedBytes: storedFive });
      expect(deadLetters(t.transport, channel)).toHaveLength(0);
      expect(t.handler.calls).toBe(0);
      expect(
        await metricValue(t.metrics.registry, 'nest_sequence_fragments_received_total', {
          channel,
        }),
      ).toBeGreaterThanOrEqual(5 + 12);

      await publishAll(t.transport, channel, firstFragments.slice(5));
      await t.transport.whenIdle();
      const peak = await sampler.stop();

      expect(t.handler.of('first')[0].bytes.equals(first)).toBe(true);
      expect(t.handler.of('second')[0].bytes.equals(second)).toBe(true);
      expect(t.handler.calls).toBe(2);
      expect(deadLetters(t.transport, channel)).toHaveLength(0);
      expect(peak.samples).toBeGreaterThan(10);
      expect(peak.maxBufferedBytes).toBeLessThanOrEqual(10_000);
      expect(peak.maxBufferedBytes).toBeGreaterThanOrEqual(storedFive);
    });

    it('at maxOpenSequences requeues a sequence that would open one more, and lets it complete once one finished', async () => {
      const channel = 'guarantees.backpressure.open';
      t = await createSequenceTestApp(channel, {
        sequence: { maxOpenSequences: 2 },
      });
      const payloads = ['a', 'b', 'c'].map((id, i) => ({ id, payload: bytes(3_000, 37 + i) }));
      const [a, b, c] = payloads.map(({ id, payload }) => makeFragments(id, payload, 1_000));
      await publishAll(t.transport, channel, [a[0], b[0]]);
      await t.transport.whenIdle();
      const sampler = sampleStats(t.store);

      await publishAll(t.transport, channel, c);
      await eventually(
        async () => (await backpressured(t!, channel, 'maxOpenSequences')) >= 6,
        'each fragment of the third sequence back-pressured twice',
      );
      expect(await stats(t)).toMatchObject({
        openSequences: 2,
        bufferedBytes: 2 * storedChargeOf(1_000),
      });
      expect(deadLetters(t.transport, channel)).toHaveLength(0);
      expect(t.handler.calls).toBe(0);

      await publishAll(t.transport, channel, a.slice(1));
      await eventually(() => t!.handler.of('c').length === 1, 'the third sequence delivered');
      await publishAll(t.transport, channel, b.slice(1));
      await t.transport.whenIdle();
      const peak = await sampler.stop();

      for (const { id, payload } of payloads) {
        expect(t.handler.of(id)).toHaveLength(1);
        expect(t.handler.of(id)[0].bytes.equals(payload)).toBe(true);
      }
      expect(deadLetters(t.transport, channel)).toHaveLength(0);
      expect(peak.maxOpenSequences).toBe(2);
      expect(await stats(t)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
    });

    it('holds a streamed sequence back part-way while the budget is full, and lets it complete once budget frees', async () => {
      const channel = 'guarantees.backpressure.streamed';
      // Room for 'declared' whole (it reserves its 4 fragments and 4,000 bytes when it opens)
      // and for the first fragment of 'streamed'.
      const budget = storedChargeOf(1_000, 1_000, 1_000, 1_000) + storedChargeOf(1_000);
      t = await createSequenceTestApp(channel, {
        sequence: { maxBufferedBytes: budget, maxSequenceBytes: 5_000 },
      });
      const declared = bytes(4_000, 40);
      const streamed = bytes(3_000, 41);
      const declaredFragments = makeFragments('declared', declared, 1_000);
      // Streamed: no declared total, so it takes budget fragment by fragment.
      const streamedFragments = makeStreamingFragments('streamed', streamed, 1_000);
      await publishAll(t.transport, channel, declaredFragments.slice(0, 1));
      await t.transport.whenIdle();

      await publishAll(t.transport, channel, streamedFragments);
      await eventually(
        async () => (await backpressured(t!, channel, 'maxBufferedBytes')) >= 4,
        'the streamed sequence back-pressured after its first fragment',
      );
      // 'declared' reserved its whole sequence; 'streamed' took the rest with its first fragment.
      expect(await stats(t)).toMatchObject({
        openSequences: 2,
        bufferedBytes: 2 * storedChargeOf(1_000),
      });
      expect(t.handler.calls).toBe(0);

      await publishAll(t.transport, channel, declaredFragments.slice(1));
      await t.transport.whenIdle();

      expect(t.handler.of('declared')[0].bytes.equals(declared)).toBe(true);
      expect(t.handler.of('streamed')[0].bytes.equals(streamed)).toBe(true);
      expect(t.handler.calls).toBe(2);
      expect(deadLetters(t.transport, channel)).toHaveLength(0);
    });
  });
});
