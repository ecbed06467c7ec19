import { config } from 'rxjs';
import { filter, map } from 'rxjs/operators';
import { SequenceEvents, type LifecycleEvent } from 'nest-sequence';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  eventually,
  makeFragments,
  makeStreamingFragments,
  publishAll,
  type SequenceTestApp,
} from '../support/sequence-test-app';
import { recordEvents } from './event-recorder';

/**
 * Message Sequence's lifecycle events, on the embedded defaults: the exact events, in order, with
 * their fields, for each outcome of a sequence and of a fragment.
 */
describe('lifecycle events: Message Sequence', () => {
  let t: SequenceTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('a sequence delivered once: started, each fragment accepted, completed; a late copy is a duplicate', async () => {
    const channel = 'events.sequence.happy';
    t = await createSequenceTestApp(channel);
    const recorder = recordEvents(t.app);
    const fragments = makeFragments('scan-1', bytes(2_500, 3), 1_000);

    await publishAll(t.transport, channel, fragments);
    await t.transport.whenIdle();
    await publishAll(t.transport, channel, [fragments[1]]);
    await t.transport.whenIdle();

    expect(t.handler.of('scan-1')).toHaveLength(1);
    const base = { at: expect.any(Number), channel, sequenceId: 'scan-1' };
    expect(recorder.events).toEqual([
      { ...base, type: 'sequence.started', fragments: 3, bytes: 2_500 },
      { ...base, type: 'fragment.accepted', position: 1, bytes: 1_000, last: false },
      { ...base, type: 'fragment.accepted', position: 2, bytes: 1_000, last: false },
      { ...base, type: 'fragment.accepted', position: 3, bytes: 500, last: true },
      {
        ...base,
        type: 'sequence.completed',
        fragments: 3,
        bytes: 2_500,
        durationMs: expect.any(Number),
        attempts: 1,
      },
      { ...base, type: 'fragment.duplicate', position: 2 },
    ]);
  });

  it('a fragment whose body fails its CRC-32 is rejected with the reason code and its ids', async () => {
    const channel = 'events.sequence.crc';
    t = await createSequenceTestApp(channel);
    const recorder = recordEvents(t.app);
    const [first] = makeFragments('bad-crc', bytes(2_000, 5), 1_000);
    const corrupted = { ...first, body: Buffer.from(first.body).fill(0, 0, 10) };

    await publishAll(t.transport, channel, [corrupted]);
    await t.transport.whenIdle();

    expect(deadLetters(t.transport, channel)).toHaveLength(1);
    expect(recorder.events).toEqual([
      {
        type: 'fragment.rejected',
        at: expect.any(Number),
        channel,
        sequenceId: 'bad-crc',
        position: 1,
        reason: 'crc-mismatch',
        detail: expect.stringMatching(/^sequence bad-crc fragment 1: body CRC-32 is \d+/),
      },
    ]);
  });

  it('a fragment with unreadable headers is rejected without ids', async () => {
    const channel = 'events.sequence.headers';
    t = await createSequenceTestApp(channel);
    const recorder = recordEvents(t.app);

    await t.transport.publish(channel, Buffer.from('x'), { 'x-sequence-id': 'h' });
    await t.transport.whenIdle();

    expect(recorder.events).toEqual([
      {
        type: 'fragment.rejected',
        at: expect.any(Number),
        channel,
        reason: expect.stringMatching(/^(malformed-header|missing-header)$/),
        detail: expect.any(String),
      },
    ]);
  });

  it('an incomplete sequence expires: its received and missing counts, bytes and age', async () => {
    const channel = 'events.sequence.expired';
    t = await createSequenceTestApp(channel, { handler: { timeoutMs: 1_000 } });
    const fragments = makeFragments('gap', bytes(3_000, 9), 1_000);
    await publishAll(t.transport, channel, [fragments[0]]);
    await t.transport.whenIdle();
    const recorder = recordEvents(t.app);

    expect(await t.sweeper.sweep(Date.now() + 5_000)).toBe(1);

    expect(recorder.events).toEqual([
      {
        type: 'sequence.expired',
        at: expect.any(Number),
        channel,
        sequenceId: 'gap',
        receivedFragments: 1,
        missingFragments: 2,
        fragments: 3,
        bytes: expect.any(Number),
        ageMs: expect.any(Number),
      },
    ]);
    const [expired] = recorder.events as Extract<LifecycleEvent, { type: 'sequence.expired' }>[];
    expect(expired.bytes).toBeGreaterThanOrEqual(1_000);
    expect(expired.ageMs).toBeGreaterThanOrEqual(4_000);
  });

  it('a handler that keeps failing: the sequence fails with handler-failed and its attempts', async () => {
    const channel = 'events.sequence.failed';
    t = await createSequenceTestApp(channel, {
      handler: { handlerRetry: { attempts: 2, baseDelayMs: 1 } },
    });
    t.handler.failNext = 2;
    const recorder = recordEvents(t.app);

    await publishAll(t.transport, channel, makeFragments('doomed', bytes(1_500, 2), 1_000));
    await t.transport.whenIdle();

    expect(deadLetters(t.transport, channel)).toHaveLength(1);
    expect(recorder.only('sequence.completed', 'sequence.failed', 'sequence.rejected')).toEqual([
      {
        type: 'sequence.failed',
        at: expect.any(Number),
        channel,
        sequenceId: 'doomed',
        reason: 'handler-failed',
        detail: expect.stringContaining('handler failed 2 time(s); last error: handler failure #2'),
        attempts: 2,
      },
    ]);
  });

  it("a fragment arriving after its sequence failed is rejected with the failure's code, as its dead letter", async () => {
    const channel = 'events.sequence.failed-late';
    t = await createSequenceTestApp(channel, {
      handler: { handlerRetry: { attempts: 1, baseDelayMs: 1 } },
    });
    t.handler.failNext = 1;
    const fragments = makeFragments('doomed-late', bytes(1_500, 4), 1_000);
    await publishAll(t.transport, channel, fragments);
    await t.transport.whenIdle();
    expect(deadLetters(t.transport, channel)).toHaveLength(1);
    const recorder = recordEvents(t.app);

    await publishAll(t.transport, channel, [fragments[0]]);
    await t.transport.whenIdle();

    const letters = deadLetters(t.transport, channel);
    expect(letters).toHaveLength(2);
    expect(String(letters[1].headers['x-death-reason'])).toMatch(/^handler-failed: /);
    expect(recorder.events).toEqual([
      {
        type: 'fragment.rejected',
        at: expect.any(Number),
        channel,
        sequenceId: 'doomed-late',
        position: 1,
        reason: 'handler-failed',
        detail: expect.stringContaining('handler failed 1 time(s)'),
      },
    ]);
  });

  it('a sequence that outgrows maxSequenceBytes is rejected whole; its fragments with the reason', async () => {
    const channel = 'events.sequence.rejected';
    t = await createSequenceTestApp(channel, { handler: { maxSequenceBytes: 1_500 } });
    const recorder = recordEvents(t.app);

    // Streamed: no declared size or bytes, so the limit strikes at the second fragment.
    const fragments = makeStreamingFragments('huge', bytes(3_000, 4), 1_000);
    await publishAll(t.transport, channel, fragments);
    await t.transport.whenIdle();

    const outline = recorder.events.map((event) => [
      event.type,
      'position' in event ? event.position : undefined,
      'reason' in event ? event.reason : undefined,
    ]);
    expect(outline).toEqual([
      ['sequence.started', undefined, undefined],
      ['fragment.accepted', 1, undefined],
      ['sequence.rejected', undefined, 'sequence-too-large'],
      ['fragment.rejected', 2, 'sequence-too-large'],
      ['fragment.rejected', 3, 'sequence-rejected'],
    ]);
    expect(recorder.events[2]).toMatchObject({ sequenceId: 'huge', channel });
  });

  it('stream mode: started with position 1, each fragment accepted as the handler takes it, completed with the last', async () => {
    const channel = 'events.sequence.stream';
    t = await createSequenceTestApp(channel);
    await t.close();
    // A stream-mode handler of its own: the recording handler reassembles.
    const { createTestApp } = await import('../support/test-app');
    const { Injectable } = await import('@nestjs/common');
    const { SequencedHandler, InMemoryTransport } = await import('nest-sequence');
    const seen: number[] = [];
    @Injectable()
    class StreamHandler {
      @SequencedHandler({ channel, mode: 'stream' })
      handle(fragment: { position: number }) {
        seen.push(fragment.position);
      }
    }
    const transport = new InMemoryTransport();
    const app = await createTestApp({
      sequence: { transport, tuning: { sweepers: { gaps: { intervalMs: false } } } },
      providers: [StreamHandler],
      logger: false,
      resources: [() => transport.close()],
    });
    try {
      const recorder = recordEvents(app.app);
      const fragments = makeFragments('streamed', bytes(2_500, 6), 1_000);

      await publishAll(transport, channel, [fragments[1], fragments[0], fragments[2]]);
      await eventually(() => seen.length === 3, 'three fragments streamed');
      await transport.whenIdle();

      const base = { at: expect.any(Number), channel, sequenceId: 'streamed' };
      expect(recorder.only('sequence.started', 'fragment.accepted', 'sequence.completed')).toEqual([
        { ...base, type: 'sequence.started', fragments: 3, bytes: 2_500 },
        { ...base, type: 'fragment.accepted', position: 1, bytes: 1_000, last: false },
        { ...base, type: 'fragment.accepted', position: 2, bytes: 1_000, last: false },
        { ...base, type: 'fragment.accepted', position: 3, bytes: 500, last: true },
        {
          ...base,
          type: 'sequence.completed',
          fragments: 3,
          bytes: 2_500,
          durationMs: expect.any(Number),
          attempts: 1,
        },
      ]);
      // Position 2 came first: the resequencer under stream mode opened a gap, and 1 closed it.
      expect(recorder.only('gap.opened', 'gap.closed').map((event) => event.type)).toEqual([
        'gap.opened',
        'gap.closed',
      ]);
    } finally {
      await app.close();
    }
  });

  describe('a subscriber that throws', () => {
    const original = config.onUnhandledError;
    afterEach(() => {
      config.onUnhandledError = original;
    });

    it('breaks neither the message path, nor the other subscribers, nor the process', async () => {
      const channel = 'events.sequence.throwing';
      t = await createSequenceTestApp(channel);
      // What rxjs would rethrow on a timer (crashing the process) lands here instead.
      const unhandled: unknown[] = [];
      config.onUnhandledError = (error) => unhandled.push(error);
      const events = t.app.get(SequenceEvents);
      const throwing = events.events$.subscribe(() => {
        throw new Error('audit table is down');
      });
      const piped = events
        .of('fragment.accepted')
        .pipe(
          map((event) => event.position),
          filter((position) => position > 0),
        )
        .subscribe(() => {
          throw new Error('piped subscriber failed');
        });
      const erroring = events.events$
        .pipe(
          map(() => {
            throw new Error('an operator failed');
          }),
        )
        .subscribe();
      const recorder = recordEvents(t.app);

      await publishAll(t.transport, channel, makeFragments('calm', bytes(2_000, 8), 1_000));
      await t.transport.whenIdle();
      await new Promise((resolve) => setTimeout(resolve, 5)); // rxjs reports on a timer

      expect(t.handler.of('calm')).toHaveLength(1);
      expect(deadLetters(t.transport, channel)).toEqual([]);
      expect(recorder.events.map((event) => event.type)).toEqual([
        'sequence.started',
        'fragment.accepted',
        'fragment.accepted',
        'sequence.completed',
      ]);
      expect(unhandled).toEqual([]);
      for (const subscription of [throwing, piped, erroring]) subscription.unsubscribe();
      expect(events.listening).toBe(true); // the recorder still listens
      recorder.stop();
      expect(events.listening).toBe(false);
    });
  });
});
