import {
  HandlerTimeoutError,
  InMemoryTransport,
  MemoryResequencerStore,
  type HandlerContext,
  type ResequencedEvent,
} from 'nest-sequence';
import { eventually } from '../support/sequence-test-app';
import {
  createResequencerTestApp,
  publishEvent,
  type ResequencerTestApp,
} from './resequencer-test-app';

// Long enough that a successful call (the handler returns at once) does not run past it when a
// full suite's garbage collection stalls the process.
const TIMEOUT_MS = 200;
const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;

/** Counts the calls running at once per key, across every handler it wraps. */
class ConcurrencyProbe {
  private readonly running = new Map<string, number>();
  readonly most = new Map<string, number>();

  async around(key: string, call: () => Promise<void>): Promise<void> {
    const now = (this.running.get(key) ?? 0) + 1;
    this.running.set(key, now);
    this.most.set(key, Math.max(this.most.get(key) ?? 0, now));
    try {
      await call();
    } finally {
      this.running.set(key, (this.running.get(key) ?? 1) - 1);
    }
  }
}

/** One call the handler saw: which event, which attempt, and its signal. */
interface Call {
  readonly event: string;
  readonly attempt: number;
  readonly signal: AbortSignal;
}

/** A gate a held call waits on until the test opens it. */
function gate(): { readonly wait: Promise<void>; open(): void } {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

describe('resequencer: a handler that runs past handlerTimeoutMs', () => {
  let t: ResequencerTestApp | undefined;
  const others: ResequencerTestApp[] = [];
  afterEach(async () => {
    await t?.close();
    t = undefined;
    for (const other of others.splice(0)) await other.close();
  });

  async function appWith(
    channel: string,
    behaviour: (event: ResequencedEvent, context: HandlerContext) => Promise<void>,
    attempts = 2,
  ) {
    t = await createResequencerTestApp({
      channel,
      gap: GAP,
      handlerTimeoutMs: TIMEOUT_MS,
      handlerRetry: { attempts, baseDelayMs: 1, maxDelayMs: 1 },
    });
    const probe = new ConcurrencyProbe();
    const calls: Call[] = [];
    t.handler.onCall = (event, context) => {
      calls.push({ event: `${event.key}:${event.seq}`, ...context });
      return probe.around(event.key, () => behaviour(event, context));
    };
    return { app: t, probe, calls };
  }

  it('never starts the next call of a key while the abandoned one still runs, and other keys go on', async () => {
    const channel = 'resequencer.timeouts.no-overlap';
    const held = gate();
    let firstCall = true;
    const { app, probe, calls } = await appWith(channel, async (event) => {
      if (event.key === 'A' && event.seq === 1 && firstCall) {
        firstCall = false;
        await held.wait; // ignores its signal: returns only when the test lets it
      }
    });

    await publishEvent(app.transport, channel, 'A', 1);
    await publishEvent(app.transport, channel, 'A', 2);
    await publishEvent(app.transport, channel, 'B', 1);
    await eventually(() => calls[0]?.signal.aborted === true, 'the first call to be abandoned');
    await eventually(() => app.handler.of('B').length === 1, 'key B to be delivered');

    // Key A waits for its abandoned call: neither the retry of A:1 nor A:2 has begun.
    expect(calls.filter((call) => call.event.startsWith('A:'))).toHaveLength(1);
    expect(calls[0].signal.reason).toBeInstanceOf(HandlerTimeoutError);
    expect((calls[0].signal.reason as HandlerTimeoutError).timeoutMs).toBe(TIMEOUT_MS);

    held.open();
    await app.transport.whenIdle();

    const ofA = calls.filter((call) => call.event.startsWith('A:'));
    expect(ofA.map((call) => `${call.event}#${call.attempt}`)).toEqual(['A:1#1', 'A:1#2', 'A:2#1']);
    // Its late return did not count: the attempt had failed, and A:1 was called again.
    expect(ofA[1].signal.aborted).toBe(false);
    expect(probe.most.get('A')).toBe(1);
    expect(app.transport.peek(`${channel}.dlq`)).toHaveLength(0);
  });

  it('dead-letters the event handler-timeout after its attempts, then the key moves on', async () => {
    const channel = 'resequencer.timeouts.dead-letter';
    const { app, probe, calls } = await appWith(channel, async (event, { signal }) => {
      if (event.seq !== 1) return;
      // Honours its signal: gives up as soon as it is aborted.
      await new Promise<void>((_, reject) =>
        signal.addEventListener('abort', () => reject(signal.reason as Error)),
      );
    });

    await publishEvent(app.transport, channel, 'K', 1);
    await publishEvent(app.transport, channel, 'K', 2);
    await app.transport.whenIdle();

    expect(calls.map((call) => `${call.event}#${call.attempt}`)).toEqual([
      'K:1#1',
      'K:1#2',
      'K:2#1',
    ]);
    expect(calls.slice(0, 2).every((call) => call.signal.aborted)).toBe(true);
    expect(app.handler.of('K')).toEqual([2]);
    const dead = app.transport.peek(`${channel}.dlq`);
    expect(dead).toHaveLength(1);
    expect(String(dead[0].headers['x-death-reason'])).toMatch(
      new RegExp(
        `^handler-timeout: key K, event 1: handler timed out after ${TIMEOUT_MS} ms ` +
          '\\(handlerTimeoutMs\\) on its last call, after 2 call\\(s\\) failed; the key moved on',
      ),
    );
    expect(probe.most.get('K')).toBe(1);
  });

  it("keeps the key's drain lease until an abandoned call returns, so another instance waits too", async () => {
    const channel = 'resequencer.timeouts.lease-kept';
    const transport = new InMemoryTransport();
    const store = new MemoryResequencerStore();
    const probe = new ConcurrencyProbe();
    const calls: Call[] = [];
    const held = gate();
    const definition = {
      channel,
      gap: GAP,
      handlerTimeoutMs: TIMEOUT_MS,
      handlerRetry: { attempts: 1 },
    };
    // Two instances on one broker and one store: the broker hands them messages in turn.
    const instances = [
      await createResequencerTestApp(definition, { transport, resequencer: { store } }),
      await createResequencerTestApp(definition, { transport, resequencer: { store } }),
    ];
    others.push(...instances);
    for (const instance of instances) {
      instance.handler.onCall = (event, context) => {
        calls.push({ event: `${event.key}:${event.seq}`, ...context });
        return probe.around(event.key, async () => {
          if (event.seq === 1) await held.wait; // ignores its signal
        });
      };
    }

    await publishEvent(transport, channel, 'K', 1);
    await eventually(
      () => transport.peek(`${channel}.dlq`).length === 1,
      'event 1 to be dead-lettered handler-timeout',
    );
    // Released while the abandoned call runs, on the other instance: it must wait for the
    // abandoned call, not overlap it.
    await publishEvent(transport, channel, 'K', 2);
    await eventually(
      async () => (await instances[0].service.inspect(channel, 'K')).next === 3,
      'event 2 to be released',
    );
    // Room for a call that would overlap to begin, if one would.
    await new Promise((resolve) => setTimeout(resolve, 100));

    expect(calls.map((call) => call.event)).toEqual(['K:1']);
    expect(String(transport.peek(`${channel}.dlq`)[0].headers['x-death-reason'])).toMatch(
      new RegExp(`^handler-timeout: key K, event 1: handler timed out after ${TIMEOUT_MS} ms`),
    );

    held.open();
    await eventually(
      () => instances.some((instance) => instance.handler.of('K').includes(2)),
      'event 2 to be handled',
    );

    expect(calls.map((call) => call.event)).toEqual(['K:1', 'K:2']);
    expect(probe.most.get('K')).toBe(1);
  });
});
