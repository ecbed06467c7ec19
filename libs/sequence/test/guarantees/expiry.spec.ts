import { storedChargeOf } from 'nest-sequence/testing';
import { Injectable, Logger } from '@nestjs/common';
import { Interval, ScheduleModule, SchedulerRegistry } from '@nestjs/schedule';
import { InMemoryTransport, MemorySequenceStore, type ExpiredSequence } from 'nest-sequence';
import { type ExpiryPolicy, type SequenceRef } from 'nest-sequence/ports';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  deathReasonOf,
  eventually,
  FaultInjectingTransport,
  makeFragments,
  makeStreamingFragments,
  metricValue,
  publishAll,
  type SequenceTestApp,
  type TestFragment,
} from '../support/sequence-test-app';
import { crc32 } from '../../src/core/checksum';
import { buildFragmentHeaders } from '../../src/core/headers';
import { MAX_LISTED_POSITIONS } from '../../src/sequence/expiry.sweeper';
import { InstrumentedStore } from './instrumented.sequence-store';

/**
 * Guarantees table, row "missing fragment": expiry by the sweeper, fixed and sliding, on the
 * embedded defaults. Time is driven through `sweeper.sweep(now)`; the store's own clock readings
 * (the `now` each accept was given) are read through an instrumented wrapper.
 */
describe('guarantees: expiry of incomplete sequences', () => {
  const running = new Set<SequenceTestApp>();
  afterEach(async () => {
    for (const app of running) await app.close();
    running.clear();
  });
  const start = async (...args: Parameters<typeof createSequenceTestApp>) => {
    const app = await createSequenceTestApp(...args);
    running.add(app);
    return app;
  };

  const TIMEOUT_MS = 1_000;

  /**
   * A 3-fragment sequence with position 2 missing: position 1 arrives at `firstAt`, position 3 at
   * `lastAt`, strictly later.
   */
  async function partialSequence(
    channel: string,
    strategy: ExpiryPolicy['strategy'],
    makeThem: (
      id: string,
      payload: Buffer,
      fragmentBytes: number,
    ) => TestFragment[] = makeFragments,
  ) {
    const store = new InstrumentedStore(new MemorySequenceStore());
    const onExpired = jest.fn<void, [ExpiredSequence]>();
    const t = await start(channel, {
      handler: {
        timeoutMs: TIMEOUT_MS,
        timeoutStrategy: strategy,
      },
      sequence: { store, onExpired },
    });
    const fragments = makeThem('gap', bytes(3_000, 71), 1_000);
    await publishAll(t.transport, channel, [fragments[0]]);
    await t.transport.whenIdle();
    const firstAt = store.accepts[0].now;
    await eventually(() => Date.now() > firstAt, 'the clock to move on');
    await publishAll(t.transport, channel, [fragments[2]]);
    await t.transport.whenIdle();
    const lastAt = store.accepts[1].now;
    expect(lastAt).toBeGreaterThan(firstAt);
    return { t, store, onExpired, fragments, firstAt, lastAt };
  }

  it('expires a sequence with a missing fragment timeout.ms after its first fragment (fixed), not before', async () => {
    const { t, firstAt } = await partialSequence('guarantees.expiry.fixed', 'fixed');

    expect(await t.sweeper.sweep(firstAt + TIMEOUT_MS - 1)).toBe(0);
    expect(await t.store.stats(Date.now())).toMatchObject({ openSequences: 1 });
    expect(await t.sweeper.sweep(firstAt + TIMEOUT_MS)).toBe(1);
    expect(await t.store.stats(Date.now())).toMatchObject({ openSequences: 0 });
  });

  it('expires a sequence with a missing fragment timeout.ms after its latest fragment (sliding), not before', async () => {
    const { t, firstAt, lastAt } = await partialSequence('guarantees.expiry.sliding', 'sliding');

    expect(await t.sweeper.sweep(firstAt + TIMEOUT_MS)).toBe(0);
    expect(await t.sweeper.sweep(lastAt + TIMEOUT_MS - 1)).toBe(0);
    expect(await t.store.stats(Date.now())).toMatchObject({ openSequences: 1 });
    expect(await t.sweeper.sweep(lastAt + TIMEOUT_MS)).toBe(1);
    expect(await t.store.stats(Date.now())).toMatchObject({ openSequences: 0 });
  });

  it('stops a sweep of a large backlog between batches when the application shuts down', async () => {
    const channel = 'guarantees.expiry.shutdown';
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const onExpired = jest.fn(() => released);
    const t = await start(channel, {
      handler: {
        timeoutMs: TIMEOUT_MS,
      },
      sequence: { onExpired },
    });
    const firsts = Array.from(
      { length: 250 },
      (_, i) => makeFragments(`backlog-${i}`, bytes(2_000, i), 1_000)[0],
    );
    await publishAll(t.transport, channel, firsts);
    await t.transport.whenIdle();
    expect(await t.store.stats(Date.now())).toMatchObject({ openSequences: 250 });

    const sweeping = t.sweeper.sweep(Date.now() + TIMEOUT_MS + 1_000);
    await eventually(() => onExpired.mock.calls.length > 0, 'the first batch reported');
    const stopping = t.sweeper.stop();
    release();

    expect(await sweeping).toBe(100);
    await stopping;
    expect(await t.store.stats(Date.now())).toMatchObject({ openSequences: 150 });
  });

  it('calls onExpired once with the received and missing positions', async () => {
    const { t, onExpired, firstAt, lastAt } = await partialSequence(
      'guarantees.expiry.hook',
      'fixed',
    );
    const now = firstAt + TIMEOUT_MS + 5;

    await t.sweeper.sweep(now);
    await t.sweeper.sweep(now + 60_000);

    expect(onExpired).toHaveBeenCalledTimes(1);
    expect(onExpired.mock.calls[0][0]).toEqual({
      scope: 'guarantees.expiry.hook',
      sequenceId: 'gap',
      receivedPositions: [1, 3],
      missingPositions: [2],
      size: 3,
      bufferedBytes: 2_000,
      firstFragmentAt: firstAt,
      lastFragmentAt: lastAt,
      ageMs: TIMEOUT_MS + 5,
    });
  });

  it('goes on when an onExpired hook never settles: the record is published, later sweeps and shutdown are not held', async () => {
    const channel = 'guarantees.expiry.hung-hook';
    const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    const t = await start(channel, {
      shutdownTimeoutMs: 100,
      publish: { confirmTimeoutMs: 100 },
      handler: {
        timeoutMs: TIMEOUT_MS,
        timeoutStrategy: 'fixed',
      },
      sequence: { onExpired: () => new Promise<void>(() => undefined) },
    });
    const first = makeFragments('hung-1', bytes(3_000, 72), 1_000);
    const second = makeFragments('hung-2', bytes(3_000, 73), 1_000);
    await publishAll(t.transport, channel, [first[0], second[0]]);
    await t.transport.whenIdle();

    // Before, the sweep awaited the hook forever; so did every later sweep and app.close().
    expect(await t.sweeper.sweep(Date.now() + TIMEOUT_MS)).toBe(2);
    expect(deadLetters(t.transport, channel)).toHaveLength(2);
    expect(error).toHaveBeenCalledWith(
      expect.stringMatching(
        /onExpired hook failed for sequence hung-1: .*did not settle within 100 ms/,
      ),
    );
    await t.close();
    running.delete(t);
    error.mockRestore();
  });

  it('puts an expired-sequence JSON record on <channel>.dlq', async () => {
    const channel = 'guarantees.expiry.record';
    const { t, firstAt } = await partialSequence(channel, 'fixed');

    await t.sweeper.sweep(firstAt + TIMEOUT_MS);

    const dead = deadLetters(t.transport, channel);
    expect(dead).toHaveLength(1);
    expect(deathReasonOf(dead[0])).toMatch(/^sequence-expired: sequence gap expired after 1000 ms/);
    expect(dead[0].headers['x-sequence-id']).toBe('gap');
    expect(dead[0].headers['content-type']).toBe('application/json');
    expect(JSON.parse(dead[0].body.toString('utf8'))).toMatchObject({
      kind: 'sequence-expired',
      channel,
      sequenceId: 'gap',
      receivedPositions: [1, 3],
      missingPositions: [2],
      size: 3,
      ageMs: TIMEOUT_MS,
    });
  });

  it('lists at most MAX_LISTED_POSITIONS positions in the record, with the counts, however far a position went', async () => {
    const channel = 'guarantees.expiry.far';
    const t = await start(channel, {
      handler: {
        timeoutMs: TIMEOUT_MS,
        timeoutStrategy: 'fixed',
      },
    });
    // One fragment of a streamed sequence (no size yet), at the highest position maxFragments
    // allows: every position before it is missing.
    const body = Buffer.from('far');
    await t.transport.publish(
      channel,
      body,
      buildFragmentHeaders({
        sequenceId: 'far',
        position: 100_000,
        last: false,
        crc32: crc32(body),
      }),
    );
    await t.transport.whenIdle();

    expect(await t.sweeper.sweep(Date.now() + TIMEOUT_MS)).toBe(1);
    const [dead] = deadLetters(t.transport, channel);
    // Before, all 99,999 missing positions were listed: about 600 KB, and past a broker's
    // limit with a larger maxFragments, when the record was lost.
    expect(dead.body.length).toBeLessThan(100_000);
    const record = JSON.parse(dead.body.toString('utf8')) as Record<string, unknown>;
    expect(record).toMatchObject({
      sequenceId: 'far',
      receivedPositions: [100_000],
      receivedCount: 1,
      missingCount: 99_999,
      missingPositionsTruncated: true,
    });
    expect(record.missingPositions).toHaveLength(MAX_LISTED_POSITIONS);
    expect((record.missingPositions as number[]).slice(0, 3)).toEqual([1, 2, 3]);
    expect(record).not.toHaveProperty('receivedPositionsTruncated');
  });

  it('frees the buffer of the expired sequence and counts it in sequences_expired_total', async () => {
    const channel = 'guarantees.expiry.freed';
    const { t, firstAt } = await partialSequence(channel, 'fixed');
    expect(await t.store.stats(Date.now())).toMatchObject({
      openSequences: 1,
      bufferedBytes: storedChargeOf(1_000, 1_000),
    });

    await t.sweeper.sweep(firstAt + TIMEOUT_MS);

    expect(await t.store.stats(Date.now())).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
    expect(
      await metricValue(t.metrics.registry, 'nest_sequence_sequences_expired_total', { channel }),
    ).toBe(1);
  });

  it('dead-letters a fragment that arrives after its sequence expired (sequence-expired)', async () => {
    const channel = 'guarantees.expiry.late';
    const { t, firstAt, fragments } = await partialSequence(channel, 'fixed');
    await t.sweeper.sweep(firstAt + TIMEOUT_MS);

    await publishAll(t.transport, channel, [fragments[1]]);
    await t.transport.whenIdle();

    const dead = deadLetters(t.transport, channel);
    expect(dead).toHaveLength(2); // the expiry record, then the late fragment
    expect(deathReasonOf(dead[1])).toMatch(/^sequence-expired: sequence gap fragment 2 arrived/);
    expect(dead[1].headers['x-sequence-position']).toBe(2);
    expect(dead[1].body.equals(fragments[1].body)).toBe(true);
    expect(t.handler.calls).toBe(0);
    expect(await t.store.stats(Date.now())).toMatchObject({ openSequences: 0 });
  });

  it('reports missing positions up to the highest received, and no size, for a streamed sequence', async () => {
    const { onExpired, t, firstAt } = await partialSequence(
      'guarantees.expiry.streamed',
      'fixed',
      // Position 3 of a streamed 4-fragment sequence is not the last: no size is known.
      (id, payload, fragmentBytes) =>
        makeStreamingFragments(id, Buffer.concat([payload, bytes(1_000, 72)]), fragmentBytes),
    );

    await t.sweeper.sweep(firstAt + TIMEOUT_MS);

    expect(onExpired).toHaveBeenCalledTimes(1);
    const [expired] = onExpired.mock.calls[0];
    expect(expired.receivedPositions).toEqual([1, 3]);
    expect(expired.missingPositions).toEqual([2]);
    expect(expired.size).toBeUndefined();
  });

  it('does not expire a complete sequence whose handler is still running', async () => {
    const channel = 'guarantees.expiry.complete';
    const store = new InstrumentedStore(new MemorySequenceStore());
    const t = await start(channel, {
      handler: {
        timeoutMs: TIMEOUT_MS,
      },
      sequence: { store },
    });
    let release: () => void = () => undefined;
    t.handler.onCall = () => new Promise<void>((resolve) => (release = resolve));
    const payload = bytes(2_000, 73);

    await publishAll(t.transport, channel, makeFragments('slow', payload, 1_000));
    await eventually(() => t.handler.calls === 1, 'the handler to be called');
    expect(await t.sweeper.sweep(store.accepts[0].now + TIMEOUT_MS)).toBe(0);
    release();
    await t.transport.whenIdle();

    expect(t.handler.of('slow')[0].bytes.equals(payload)).toBe(true);
    expect(deadLetters(t.transport, channel)).toHaveLength(0);
  });

  it('expires a sequence once when two instances sweep at the same time', async () => {
    const channel = 'guarantees.expiry.two-sweepers';
    const transport = new InMemoryTransport();
    const store = new InstrumentedStore(new MemorySequenceStore());
    const hooks = [jest.fn(), jest.fn()];
    const [one, two] = [
      await start(channel, {
        transport,
        sequence: { store, onExpired: hooks[0] },
      }),
      await start(channel, {
        transport,
        sequence: { store, onExpired: hooks[1] },
      }),
    ];
    await publishAll(
      transport,
      channel,
      makeFragments('contended', bytes(3_000, 74), 1_000).slice(0, 2),
    );
    await transport.whenIdle();
    const now = store.accepts[0].now + 300_000; // the default timeout

    const expired = await Promise.all([one.sweeper.sweep(now), two.sweeper.sweep(now)]);

    expect(expired[0] + expired[1]).toBe(1);
    expect(hooks[0].mock.calls.length + hooks[1].mock.calls.length).toBe(1);
    expect(deadLetters(transport, channel)).toHaveLength(1);
    const counted = await Promise.all(
      [one, two].map((app) =>
        metricValue(app.metrics.registry, 'nest_sequence_sequences_expired_total', { channel }),
      ),
    );
    expect(counted[0] + counted[1]).toBe(1);
  });

  it("puts the record on the module's sequence.deadLetterChannel when an instance not consuming the channel sweeps", async () => {
    const transport = new InMemoryTransport();
    const store = new InstrumentedStore(new MemorySequenceStore());
    // Two roles on one store and one module configuration, each consuming a channel of its own.
    const sequence = { store, deadLetterChannel: 'guarantees.expiry.all.dlq' };
    await start('guarantees.expiry.x', { transport, sequence });
    const other = await start('guarantees.expiry.y', { transport, sequence });
    await publishAll(transport, 'guarantees.expiry.x', [
      makeFragments('gap', bytes(2_000, 5), 1_000)[0],
    ]);
    await transport.whenIdle();
    const now = store.accepts[0].now + 300_000; // the default timeout

    expect(await other.sweeper.sweep(now)).toBe(1);

    expect(transport.peek('guarantees.expiry.x.dlq')).toHaveLength(0);
    expect(transport.peek('guarantees.expiry.all.dlq')).toHaveLength(1);
  });

  it('publishes the record again when the broker refuses it once', async () => {
    const channel = 'guarantees.expiry.record-retried';
    const inner = new InMemoryTransport();
    const transport = new FaultInjectingTransport(inner);
    const store = new InstrumentedStore(new MemorySequenceStore());
    const t = await start(channel, {
      transport: transport as unknown as InMemoryTransport,
      sequence: { store },
      publish: { retry: { attempts: 3, baseDelayMs: 1 } },
    });
    await publishAll(transport, channel, [makeFragments('refused', bytes(2_000, 3), 1_000)[0]]);
    await inner.whenIdle();
    let refusals = 1;
    transport.beforePublish = (attempt) => {
      if (attempt.channel === `${channel}.dlq` && refusals-- > 0) {
        throw new Error('injected fault: the broker nacked the publish');
      }
    };

    expect(await t.sweeper.sweep(store.accepts[0].now + 300_000)).toBe(1);

    // Claimed by that sweep, which no later one would list again: its record was sent again.
    expect(transport.attempts.filter((a) => a.channel === `${channel}.dlq`)).toHaveLength(2);
    expect(inner.peek(`${channel}.dlq`)).toHaveLength(1);
  });

  it('is run by the scheduler every sweepIntervalMs', async () => {
    const channel = 'guarantees.expiry.scheduled';
    const onExpired = jest.fn<void, [ExpiredSequence]>();
    const t = await start(channel, {
      handler: {
        timeoutMs: 50,
      },
      imports: [ScheduleModule.forRoot()],
      tuning: { sweepers: { expiry: { intervalMs: 20 } } },
      sequence: { onExpired },
    });
    expect(t.app.get(SchedulerRegistry).getIntervals()).toContain('nest-sequence:expiry-sweeper');

    await publishAll(
      t.transport,
      channel,
      makeFragments('scheduled', bytes(2_000, 75), 1_000).slice(0, 1),
    );
    await eventually(() => deadLetters(t.transport, channel).length === 1, 'the expiry record');

    expect(onExpired).toHaveBeenCalledTimes(1);
    expect(onExpired.mock.calls[0][0].ageMs).toBeGreaterThanOrEqual(50);
    expect(deathReasonOf(deadLetters(t.transport, channel)[0])).toMatch(/^sequence-expired: /);
    expect(await t.store.stats(Date.now())).toMatchObject({ openSequences: 0 });
  });

  it('sweeps on its own timer when the app has no ScheduleModule', async () => {
    const channel = 'guarantees.expiry.no-schedule-module';
    const t = await start(channel, {
      handler: {
        timeoutMs: 50,
      },
      tuning: { sweepers: { expiry: { intervalMs: 20 } } },
    });
    expect(() => t.app.get(SchedulerRegistry)).toThrow();

    await publishAll(
      t.transport,
      channel,
      makeFragments('unscheduled', bytes(2_000, 76), 1_000).slice(0, 1),
    );
    await eventually(() => deadLetters(t.transport, channel).length === 1, 'the expiry record');
    expect(deathReasonOf(deadLetters(t.transport, channel)[0])).toMatch(/^sequence-expired: /);
  });

  it("does not run the app's own scheduled jobs twice", async () => {
    let ticks = 0;
    @Injectable()
    class Ticker {
      @Interval(40)
      tick(): void {
        ticks++;
      }
    }
    const t = await start('guarantees.expiry.app-jobs', {
      imports: [ScheduleModule.forRoot()],
      providers: [Ticker],
    });
    await new Promise((resolve) => setTimeout(resolve, 430));
    await t.close();
    // 430 ms / 40 ms: at most 10 ticks (fewer on a busy machine); a second
    // ScheduleModule.forRoot() inside the library made it about 20.
    expect(ticks).toBeGreaterThanOrEqual(1);
    expect(ticks).toBeLessThanOrEqual(11);
  });

  it('reports every sequence it claimed even when claiming another one of the batch fails', async () => {
    const channel = 'guarantees.expiry.partial-claim-failure';
    class FlakyExpireStore extends MemorySequenceStore {
      override async expire(ref: SequenceRef, now: number, retentionMs: number) {
        if (ref.sequenceId === 'flaky') throw new Error('injected fault: expire timed out');
        return super.expire(ref, now, retentionMs);
      }
    }
    const onExpired = jest.fn<void, [ExpiredSequence]>();
    const t = await start(channel, {
      handler: {
        timeoutMs: 1_000,
      },
      sequence: { store: new FlakyExpireStore(), onExpired },
    });
    for (const id of ['steady-1', 'flaky', 'steady-2']) {
      await publishAll(
        t.transport,
        channel,
        makeFragments(id, bytes(2_000, 80), 1_000).slice(0, 1),
      );
    }
    await t.transport.whenIdle();

    expect(await t.sweeper.sweep(Date.now() + 5_000)).toBe(2);

    expect(onExpired.mock.calls.map(([expired]) => expired.sequenceId).sort()).toEqual([
      'steady-1',
      'steady-2',
    ]);
    expect(deadLetters(t.transport, channel)).toHaveLength(2);
    // The one whose claim failed is still due: the next sweep reports it.
    expect(await t.store.listExpired(Date.now() + 5_000, 10)).toEqual([
      { scope: channel, sequenceId: 'flaky' },
    ]);
  });

  it('reports a sequence whose claim answered after storeTimeoutMs, late, rather than never', async () => {
    const channel = 'guarantees.expiry.late-claim';
    class SlowExpireStore extends MemorySequenceStore {
      override async expire(ref: SequenceRef, now: number, retentionMs: number) {
        // The store expires it, and answers past the module's wait (a stall that heals).
        const expired = await super.expire(ref, now, retentionMs);
        await new Promise((resolve) => setTimeout(resolve, 300));
        return expired;
      }
    }
    const onExpired = jest.fn<void, [ExpiredSequence]>();
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const t = await start(channel, {
      handler: { timeoutMs: 1_000 },
      sequence: { store: new SlowExpireStore(), onExpired },
      tuning: { storeTimeoutMs: 100 },
    });
    try {
      await publishAll(
        t.transport,
        channel,
        makeFragments('slow', bytes(2_000, 81), 1_000).slice(0, 1),
      );
      await t.transport.whenIdle();

      expect(await t.sweeper.sweep(Date.now() + 5_000)).toBe(0);
      // No longer due (the store expired it): only the late answer can report it, and the
      // sweeper's stop waits for that report.
      expect(await t.store.listExpired(Date.now() + 5_000, 10)).toEqual([]);
      await t.sweeper.stop();

      expect(onExpired).toHaveBeenCalledTimes(1);
      expect(onExpired.mock.calls[0][0]).toMatchObject({
        sequenceId: 'slow',
        missingPositions: [2],
      });
      expect(deadLetters(t.transport, channel)).toHaveLength(1);
    } finally {
      warn.mockRestore();
    }
  });
});
