import { HandlerTimeoutError, type HandlerContext } from 'nest-sequence';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  deathReasonOf,
  eventually,
  makeFragments,
  metricValue,
  publishAll,
  type SequenceTestApp,
} from '../support/sequence-test-app';

// Long enough that a successful call (the handler returns at once) does not run past it when a
// full suite's garbage collection stalls the process.
const TIMEOUT_MS = 200;

/** Guarantees table, row "handler never returns", on the embedded defaults. */
describe('guarantees: a handler that runs past handlerTimeoutMs', () => {
  let t: SequenceTestApp | undefined;
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => void unhandled.push(reason);
  beforeEach(() => {
    unhandled.length = 0;
    process.on('unhandledRejection', onUnhandled);
  });
  afterEach(async () => {
    process.off('unhandledRejection', onUnhandled);
    await t?.close();
    t = undefined;
  });

  const payload = bytes(3_000, 91);
  const sample = (app: SequenceTestApp, name: string, labels: Record<string, string>) =>
    metricValue(app.metrics.registry, `nest_sequence_${name}`, labels);

  async function appOn(channel: string, options: { attempts: number; moduleWide?: boolean }) {
    const timeout = { handlerTimeoutMs: TIMEOUT_MS };
    t = await createSequenceTestApp(channel, {
      handler: {
        handlerRetry: { attempts: options.attempts, baseDelayMs: 1, maxDelayMs: 1 },
        ...(options.moduleWide ? {} : timeout),
      },
      ...(options.moduleWide ? timeout : {}),
    });
    const contexts: HandlerContext[] = [];
    return { app: t, contexts };
  }

  it.each([
    ['set on the decorator', false],
    ['set module-wide', true],
  ])(
    'abandons a call that never returns (%s): retried per handlerRetry, then dead-lettered handler-timeout',
    async (_how, moduleWide) => {
      const channel = `guarantees.timeout.never-returns.${String(moduleWide)}`;
      const { app, contexts } = await appOn(channel, { attempts: 3, moduleWide });
      app.handler.onCall = (_payload, context) => {
        contexts.push(context);
        return new Promise<void>(() => undefined); // never settles
      };
      await publishAll(app.transport, channel, makeFragments('stuck', payload, 1_000));
      await app.transport.whenIdle();

      expect(contexts.map((context) => context.attempt)).toEqual([1, 2, 3]);
      for (const { signal } of contexts) {
        expect(signal.aborted).toBe(true);
        expect(signal.reason).toBeInstanceOf(HandlerTimeoutError);
        expect(signal.reason).toMatchObject({ channel, timeoutMs: TIMEOUT_MS });
      }
      const dead = deadLetters(app.transport, channel);
      expect(dead.map(deathReasonOf)).toEqual([
        `handler-timeout: sequence stuck: handler timed out after ${TIMEOUT_MS} ms ` +
          '(handlerTimeoutMs) on its last call, after 3 call(s) failed',
      ]);
      // The completion lease went with the verdict: the message was settled, not held.
      expect(app.transport.depth(channel) + app.transport.unsettled(channel)).toBe(0);
      expect(await sample(app, 'handler_failures_total', { channel })).toBe(3);
      expect(
        await sample(app, 'sequences_rejected_total', { channel, reason: 'handler-timeout' }),
      ).toBe(1);
    },
  );

  it('ignores the late result of an abandoned call: a late success neither completes nor acks twice', async () => {
    const channel = 'guarantees.timeout.late-success';
    const { app, contexts } = await appOn(channel, { attempts: 2 });
    let releaseFirst!: () => void;
    const first = new Promise<void>((resolve) => (releaseFirst = resolve));
    let firstReturned = false;
    app.handler.onCall = async (_payload, context) => {
      contexts.push(context);
      if (context.attempt !== 1) return;
      await first; // ignores its signal
      firstReturned = true;
    };
    await publishAll(app.transport, channel, makeFragments('late', payload, 1_000));
    await app.transport.whenIdle();

    expect(contexts.map((context) => context.attempt)).toEqual([1, 2]);
    expect(await sample(app, 'sequences_completed_total', { channel })).toBe(1);

    releaseFirst();
    await eventually(() => firstReturned, 'the abandoned call to return');
    await app.transport.whenIdle();

    expect(await sample(app, 'sequences_completed_total', { channel })).toBe(1);
    expect(deadLetters(app.transport, channel)).toHaveLength(0);
    expect(app.transport.depth(channel) + app.transport.unsettled(channel)).toBe(0);
  });

  it('observes the late failure of an abandoned call: no unhandled rejection', async () => {
    const channel = 'guarantees.timeout.late-failure';
    const { app, contexts } = await appOn(channel, { attempts: 1 });
    let failFirst!: (error: Error) => void;
    app.handler.onCall = (_payload, context) => {
      contexts.push(context);
      return new Promise<void>((_, reject) => (failFirst = reject));
    };
    await publishAll(app.transport, channel, makeFragments('late-failure', payload, 1_000));
    await app.transport.whenIdle();
    expect(deadLetters(app.transport, channel)).toHaveLength(1);

    failFirst(new Error('gave up late (expected by the test)'));
    await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setImmediate(resolve));

    expect(unhandled).toEqual([]);
    expect(deadLetters(app.transport, channel)).toHaveLength(1);
  });

  it('passes a signal that is never aborted when no limit is set', async () => {
    const channel = 'guarantees.timeout.none';
    t = await createSequenceTestApp(channel);
    const contexts: HandlerContext[] = [];
    t.handler.onCall = async (_payload, context) => void contexts.push(context);
    await publishAll(t.transport, channel, makeFragments('free', payload, 1_000));
    await t.transport.whenIdle();

    expect(contexts).toHaveLength(1);
    expect(contexts[0].signal.aborted).toBe(false);
    expect(t.handler.deliveries).toHaveLength(1);
  });
});
