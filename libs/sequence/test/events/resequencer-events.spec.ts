import { MemoryResequencerStore } from 'nest-sequence';
import type {
  GapPolicy,
  GapResolveContext,
  ResequencerKey,
} from '../../src/ports/resequencer-store.port';
import { ResequencerCatalog } from '../../src/resequencer/resequencer.catalog';
import { eventually } from '../support/sequence-test-app';
import {
  createResequencerTestApp,
  publishEvent,
  type ResequencerTestApp,
} from '../resequencer/resequencer-test-app';
import { recordEvents } from './event-recorder';

const TIMEOUT_MS = 10_000;

/** The Resequencer's gap events, on the embedded defaults; sweeps run by the test. */
describe('lifecycle events: Resequencer', () => {
  let t: ResequencerTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  async function bufferBehindGap(channel: string, key: string, seqs: number[]) {
    for (const seq of seqs) await publishEvent(t!.transport, channel, key, seq);
    await eventually(
      async () => (await t!.service.buffered(channel, key)).length === seqs.length,
      `${seqs.length} buffered events of ${key}`,
    );
  }

  it('an event ahead of its turn opens a gap; the missing one closes it, releasing both', async () => {
    const channel = 'events.gaps.close';
    t = await createResequencerTestApp({
      channel,
      gap: { timeoutMs: TIMEOUT_MS, policy: 'alert' },
    });
    const recorder = recordEvents(t.app);

    await bufferBehindGap(channel, 'T1', [2]);
    await publishEvent(t.transport, channel, 'T1', 1);
    await eventually(() => t!.handler.received.length === 2, 'both delivered');

    const base = { at: expect.any(Number), channel, resequencer: channel, key: 'T1' };
    expect(recorder.events).toEqual([
      { ...base, type: 'gap.opened', expected: 1, seq: 2, held: 1 },
      { ...base, type: 'gap.closed', expected: 1, released: 2, waitedMs: expect.any(Number) },
    ]);
  });

  it("policy 'skip': the sweep gives up the missing range, with the wait and the reason", async () => {
    const channel = 'events.gaps.skip';
    t = await createResequencerTestApp({ channel, gap: { timeoutMs: TIMEOUT_MS, policy: 'skip' } });
    await bufferBehindGap(channel, 'T2', [4, 5]);
    const recorder = recordEvents(t.app);

    await t.sweeper.sweep(Date.now() + TIMEOUT_MS + 1);
    await eventually(() => t!.handler.received.length === 2, 'the held events released');

    expect(recorder.events).toEqual([
      {
        type: 'gap.skipped',
        at: expect.any(Number),
        channel,
        resequencer: channel,
        key: 'T2',
        from: 1,
        to: 3,
        waitedMs: expect.any(Number),
        reason: `1 missing past gap.timeoutMs (${TIMEOUT_MS} ms)`,
      },
    ]);
    const [skipped] = recorder.events as Array<{ waitedMs: number }>;
    expect(skipped.waitedMs).toBeGreaterThan(TIMEOUT_MS);
  });

  it("an operator's skip gives up the missing range as the sweep does, with its own reason", async () => {
    const channel = 'events.gaps.operator-skip';
    t = await createResequencerTestApp({
      channel,
      gap: { timeoutMs: TIMEOUT_MS, policy: 'alert' },
    });
    const recorder = recordEvents(t.app);
    await bufferBehindGap(channel, 'T4', [3, 4]);
    const resequencer = t.app.get(ResequencerCatalog).get(channel)!.resequencer;

    expect(await resequencer.skipGap('T4')).toBeGreaterThan(0);
    await eventually(() => t!.handler.received.length === 2, 'the held events released');

    const base = { at: expect.any(Number), channel, resequencer: channel, key: 'T4' };
    expect(recorder.events).toEqual([
      { ...base, type: 'gap.opened', expected: 1, seq: 3, held: 1 },
      {
        ...base,
        type: 'gap.skipped',
        from: 1,
        to: 2,
        waitedMs: expect.any(Number),
        reason: '1 skipped by an operator',
      },
    ]);
  });

  it("policy 'skip': reports the range the skip gave up, not the gap as it was listed", async () => {
    const channel = 'events.gaps.skip-moved';
    t = await createResequencerTestApp({ channel, gap: { timeoutMs: TIMEOUT_MS, policy: 'skip' } });
    // Listed oldest first: A's gap is resolved and drained before B's turn.
    await bufferBehindGap(channel, 'A', [2]);
    await bufferBehindGap(channel, 'B', [5]);
    const recorder = recordEvents(t.app);
    // While A's drain delivers, B:3 comes: B's skip then gives up 1-2 only, and releases 3.
    t.handler.onCall = async (event) => {
      if (event.key !== 'A') return;
      await publishEvent(t!.transport, channel, 'B', 3);
      await eventually(async () => (await t!.service.buffered(channel, 'B')).length === 2, 'B:3');
    };

    await t.sweeper.sweep(Date.now() + TIMEOUT_MS + 1);
    await eventually(() => t!.handler.of('B').length === 1, "B's released event");

    expect(t.handler.of('B')).toEqual([3]);
    const skipped = recorder.events.filter((event) => event.type === 'gap.skipped');
    expect(skipped).toEqual([
      expect.objectContaining({ key: 'A', from: 1, to: 1 }),
      expect.objectContaining({ key: 'B', from: 1, to: 2 }),
    ]);
    expect(t.gaps.filter((gap) => gap.key === 'B')).toEqual([
      expect.objectContaining({ type: 'skipped', from: 1, to: 2 }),
    ]);
  });

  it("an operator's skip reports the range it gave up, whatever came after the key was read", async () => {
    const channel = 'events.gaps.operator-skip-moved';
    let beforeResolve: (() => Promise<void>) | undefined;
    // Runs the hook between whatever the skip read before and the store's step.
    class HookedStore extends MemoryResequencerStore {
      override async resolveGap(
        key: ResequencerKey,
        policy: GapPolicy,
        context: GapResolveContext,
      ) {
        await beforeResolve?.();
        return super.resolveGap(key, policy, context);
      }
    }
    t = await createResequencerTestApp(
      { channel, gap: { timeoutMs: TIMEOUT_MS, policy: 'alert' } },
      { resequencer: { store: new HookedStore() } },
    );
    await bufferBehindGap(channel, 'T5', [5]);
    const recorder = recordEvents(t.app);
    beforeResolve = async () => {
      beforeResolve = undefined;
      await publishEvent(t!.transport, channel, 'T5', 3);
      await eventually(async () => (await t!.service.buffered(channel, 'T5')).length === 2, '3');
    };
    const resequencer = t.app.get(ResequencerCatalog).get(channel)!.resequencer;

    await resequencer.skipGap('T5');
    await eventually(() => t!.handler.received.length === 1, 'the released event');

    expect(t.handler.of('T5')).toEqual([3]);
    expect(recorder.events.filter((event) => event.type === 'gap.skipped')).toEqual([
      expect.objectContaining({ key: 'T5', from: 1, to: 2 }),
    ]);
  });

  it("policy 'dead-letter': the events held behind the gap are dead-lettered, counted", async () => {
    const channel = 'events.gaps.dead-letter';
    t = await createResequencerTestApp({
      channel,
      gap: { timeoutMs: TIMEOUT_MS, policy: 'dead-letter' },
    });
    await bufferBehindGap(channel, 'T3', [3, 4]);
    const recorder = recordEvents(t.app);

    await t.sweeper.sweep(Date.now() + TIMEOUT_MS + 1);
    await eventually(() => t!.transport.peek(`${channel}.dlq`).length === 2, 'dead letters');

    expect(recorder.events).toEqual([
      {
        type: 'gap.dead-lettered',
        at: expect.any(Number),
        channel,
        resequencer: channel,
        key: 'T3',
        expected: 1,
        events: 2,
        waitedMs: expect.any(Number),
        reason: `1 missing past gap.timeoutMs (${TIMEOUT_MS} ms)`,
      },
    ]);
    expect(t.handler.received).toEqual([]);
  });
});
