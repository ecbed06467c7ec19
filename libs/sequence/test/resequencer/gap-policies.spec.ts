import { ScheduleModule, SchedulerRegistry } from '@nestjs/schedule';
import { MemoryResequencerStore, type InboundMessage } from 'nest-sequence';
import { eventually, metricValue } from '../support/sequence-test-app';
import {
  createResequencerTestApp,
  publishEvent,
  type ResequencerTestApp,
} from './resequencer-test-app';

const TIMEOUT_MS = 10_000;
/** The embedded store's retention (its default). */
const RETENTION_MS = 604_800_000;
const channel = 'transfers.status';
const dlq = `${channel}.dlq`;

/** A sweep as it would run once the gap timeout has passed. */
const afterTimeout = () => Date.now() + TIMEOUT_MS + 1;

function reasons(messages: InboundMessage[]): string[] {
  return messages.map((message) => String(message.headers['x-death-reason']));
}

describe('Resequencer gap policies (embedded defaults, sweeps run by the test)', () => {
  let t: ResequencerTestApp;

  afterEach(async () => {
    await t?.close();
  });

  async function bufferBehindGap(key: string, seqs: number[]): Promise<void> {
    for (const seq of seqs) await publishEvent(t.transport, channel, key, seq);
    await eventually(
      async () => (await t.service.buffered(channel, key)).length === seqs.length,
      `${seqs.length} buffered events of ${key}`,
    );
  }

  describe("'alert'", () => {
    beforeEach(async () => {
      t = await createResequencerTestApp({
        channel,
        gap: { timeoutMs: TIMEOUT_MS, policy: 'alert' },
      });
    });

    it('is swept by the scheduler every sweepIntervalMs when the app has the ScheduleModule', async () => {
      await t.close();
      t = await createResequencerTestApp(
        { channel, gap: { timeoutMs: 50, policy: 'alert' } },
        {
          tuning: { sweepers: { gaps: { intervalMs: 20 } } },
        },
        [ScheduleModule.forRoot()],
      );
      expect(t.app.get(SchedulerRegistry).getIntervals()).toContain('nest-sequence:gap-sweeper');

      await bufferBehindGap('T1', [2, 3]);
      await eventually(() => t.gaps.length > 0, 'the gap alert, with no sweep run by the test');
      expect(t.gaps).toEqual([expect.objectContaining({ type: 'alert', key: 'T1', expected: 1 })]);
      expect(reasons(t.transport.peek(dlq))).toEqual([
        expect.stringMatching(/^resequencer-gap-alert: key T1 /),
      ]);
    });

    it('leaves a gap alone before its timeout', async () => {
      await bufferBehindGap('T1', [2, 3]);
      await expect(t.sweeper.sweep(Date.now() + TIMEOUT_MS - 1_000)).resolves.toMatchObject({
        gapsResolved: 0,
      });
      expect(t.transport.peek(dlq)).toEqual([]);
      expect(t.gaps).toEqual([]);
    });

    it('reports the gap once (record, event, metric) and keeps waiting; the late event then releases all', async () => {
      await bufferBehindGap('T1', [2, 3]);
      await t.sweeper.sweep(afterTimeout());
      await t.sweeper.sweep(afterTimeout());

      expect(t.gaps).toEqual([
        expect.objectContaining({
          type: 'alert',
          resequencer: channel,
          key: 'T1',
          expected: 1,
          buffered: 2,
        }),
      ]);
      const records = t.transport.peek(dlq);
      expect(reasons(records)).toEqual([expect.stringMatching(/^resequencer-gap-alert: key T1 /)]);
      expect(JSON.parse(records[0].body.toString())).toMatchObject({
        kind: 'resequencer-gap-alert',
        key: 'T1',
        expected: 1,
        buffered: 2,
      });
      expect(t.handler.received).toEqual([]);
      expect(await t.service.buffered(channel, 'T1')).toEqual([2, 3]);
      expect(await t.service.openGaps(channel)).toEqual([
        expect.objectContaining({ key: 'T1', expected: 1, buffered: 2, alerted: true }),
      ]);
      expect(
        await metricValue(t.metrics.registry, 'nest_sequence_resequencer_gaps_total', {
          type: 'alert',
        }),
      ).toBe(1);

      await publishEvent(t.transport, channel, 'T1', 1);
      await eventually(() => t.handler.received.length === 3, 'the released run');
      expect(t.handler.of('T1')).toEqual([1, 2, 3]);
    });

    it("dead-letters what an alerted gap holds once its key has been idle for nine tenths of the store's retention", async () => {
      await bufferBehindGap('T1', [2, 3]);
      await t.sweeper.sweep(afterTimeout());
      // The memory store's default retention is 7 days: nine tenths of it is the line.
      const idle = RETENTION_MS - RETENTION_MS / 10;
      await expect(t.sweeper.sweep(Date.now() + idle - 60_000)).resolves.toMatchObject({
        gapsResolved: 0,
      });
      expect(await t.service.buffered(channel, 'T1')).toEqual([2, 3]);

      await expect(t.sweeper.sweep(Date.now() + idle + 60_000)).resolves.toMatchObject({
        gapsResolved: 1,
      });
      const records = t.transport.peek(dlq);
      expect(reasons(records)).toEqual([
        expect.stringMatching(/^resequencer-gap-alert: key T1 /),
        expect.stringMatching(
          /^resequencer-gap-dead-letter: key T1: event 2 was buffered while 1 stayed missing with no change to the key for nine tenths of the store's retention/,
        ),
        expect.stringMatching(/^resequencer-gap-dead-letter: key T1: event 3 /),
      ]);
      expect(records.slice(1).map((message) => message.body.toString())).toEqual(['T1#2', 'T1#3']);
      expect(t.gaps.map((gap) => gap.type)).toEqual(['alert', 'dead-lettered', 'dead-lettered']);
      expect(await t.service.inspect(channel, 'T1')).toMatchObject({ next: 4, buffered: [] });
      expect(t.handler.received).toEqual([]);
    });
  });

  describe("'skip'", () => {
    beforeEach(async () => {
      t = await createResequencerTestApp({
        channel,
        gap: { timeoutMs: TIMEOUT_MS, policy: 'skip' },
      });
    });

    it("does not hold the other keys' gaps while one key's handler is slow", async () => {
      let open!: () => void;
      const gate = new Promise<void>((resolve) => (open = resolve));
      t.handler.onCall = (event) => (event.key === 'SLOW' ? gate : Promise.resolve());
      try {
        await bufferBehindGap('SLOW', [2]);
        // Skips SLOW's gap; its drain then waits on the handler.
        const first = t.sweeper.sweep(afterTimeout());
        const late = new Promise((resolve) => setTimeout(() => resolve('still sweeping'), 5_000));
        await expect(Promise.race([first, late])).resolves.toMatchObject({ gapsResolved: 1 });

        await bufferBehindGap('OTHER', [2]);
        await t.sweeper.sweep(afterTimeout());
        await eventually(() => t.handler.of('OTHER').length === 1, "OTHER's event, past its gap");
        expect(t.handler.of('SLOW')).toEqual([]);
      } finally {
        open();
      }
      await eventually(() => t.handler.of('SLOW').length === 1, "SLOW's event, once let go");
    });

    it('gives up the missing range, records it, and releases what follows; a late event is dropped', async () => {
      await bufferBehindGap('T1', [3, 4, 6]);
      await t.sweeper.sweep(afterTimeout());

      expect(t.handler.of('T1')).toEqual([3, 4]);
      expect(t.gaps).toEqual([
        expect.objectContaining({ type: 'skipped', key: 'T1', from: 1, to: 2 }),
      ]);
      expect(reasons(t.transport.peek(dlq))).toEqual([
        expect.stringMatching(/^resequencer-gap-skipped: key T1: gave up waiting for 1-2/),
      ]);
      expect(await t.service.inspect(channel, 'T1')).toMatchObject({ next: 5, buffered: [6] });

      await publishEvent(t.transport, channel, 'T1', 1); // late now
      await publishEvent(t.transport, channel, 'T1', 5);
      await eventually(() => t.handler.received.length === 4, 'the rest');
      expect(t.handler.of('T1')).toEqual([3, 4, 5, 6]);
    });
  });

  it("'skip': a gap the skip leaves open dates from when the sweep resolved it, not from when the sweep began", async () => {
    t = await createResequencerTestApp(
      { channel, gap: { timeoutMs: TIMEOUT_MS, policy: 'skip' } },
      { handlerRetry: { attempts: 3, baseDelayMs: 150 } },
    );
    // T1's gap is the older: resolved first, its drain then retries a failing handler (~450 ms).
    t.handler.failing.add('T1:3');
    await bufferBehindGap('T1', [3]);
    await bufferBehindGap('T2', [3, 5]);
    const sweptAt = afterTimeout();
    const started = Date.now();

    await t.sweeper.sweep(sweptAt);

    // T2's skip released 3; 5 waits behind a new gap at 4, open since T2 was resolved.
    const t2 = await t.service.inspect(channel, 'T2');
    expect(t2).toMatchObject({ next: 4, buffered: [5] });
    expect(t2.gapSince).toBeGreaterThanOrEqual(sweptAt + 100);
    expect(t2.gapSince).toBeLessThanOrEqual(sweptAt + (Date.now() - started));
  });

  describe("'dead-letter'", () => {
    beforeEach(async () => {
      t = await createResequencerTestApp({
        channel,
        gap: { timeoutMs: TIMEOUT_MS, policy: 'dead-letter' },
      });
    });

    it('moves the buffered events to the dead-letter channel, byte-exact, and moves the key past them', async () => {
      await bufferBehindGap('T1', [2, 3]);
      await t.sweeper.sweep(afterTimeout());

      const moved = t.transport.peek(dlq);
      expect(moved.map((message) => message.body.toString())).toEqual(['T1#2', 'T1#3']);
      expect(reasons(moved)).toEqual([
        expect.stringMatching(/^resequencer-gap-dead-letter: key T1: event 2 was buffered while 1/),
        expect.stringMatching(/^resequencer-gap-dead-letter: key T1: event 3 /),
      ]);
      expect(t.gaps.map((gap) => gap.type)).toEqual(['dead-lettered', 'dead-lettered']);
      expect(await t.service.inspect(channel, 'T1')).toMatchObject({ next: 4, buffered: [] });
      expect(t.handler.received).toEqual([]);

      await publishEvent(t.transport, channel, 'T1', 1); // late: the key moved on
      await publishEvent(t.transport, channel, 'T1', 4);
      await eventually(() => t.handler.received.length === 1, 'event 4');
      expect(t.handler.of('T1')).toEqual([4]);
    });
  });

  it("applies 'skip' to a gap that 'alert' reported before the policy changed", async () => {
    // Instances of one resequencer share its keys: one still on 'alert' (a rolling deploy, or
    // the policy changed since), one on 'skip'.
    const store = new MemoryResequencerStore();
    const alerting = await createResequencerTestApp(
      { channel, gap: { timeoutMs: TIMEOUT_MS, policy: 'alert' } },
      { resequencer: { store } },
    );
    try {
      t = await createResequencerTestApp(
        { channel, gap: { timeoutMs: TIMEOUT_MS, policy: 'skip' } },
        { resequencer: { store } },
      );
      await bufferBehindGap('T1', [3, 4]);
      await alerting.sweeper.sweep(afterTimeout());
      expect(alerting.gaps).toEqual([expect.objectContaining({ type: 'alert', key: 'T1' })]);

      await expect(t.sweeper.sweep(afterTimeout())).resolves.toMatchObject({ gapsResolved: 1 });
      expect(t.gaps).toEqual([
        expect.objectContaining({ type: 'skipped', key: 'T1', from: 1, to: 2 }),
      ]);
      expect(t.handler.of('T1')).toEqual([3, 4]);
      expect(await t.service.inspect(channel, 'T1')).toMatchObject({ next: 5, buffered: [] });
    } finally {
      await alerting.close();
    }
  });

  it('every instance may sweep at once: each gap is resolved once', async () => {
    t = await createResequencerTestApp({ channel, gap: { timeoutMs: TIMEOUT_MS, policy: 'skip' } });
    await bufferBehindGap('T1', [2]);
    await bufferBehindGap('T2', [5]);
    const now = afterTimeout();
    // The sweeper shares one run between overlapping calls; resequencers sweep independently.
    const resequencer = t.service.named(channel);
    const reports = await Promise.all([resequencer.sweep(now), resequencer.sweep(now)]);
    expect(reports.reduce((sum, report) => sum + report.gapsResolved, 0)).toBe(2);
    expect(t.gaps.filter((gap) => gap.type === 'skipped')).toHaveLength(2);
    expect(t.handler.of('T1')).toEqual([2]);
    expect(t.handler.of('T2')).toEqual([5]);
  });
});
