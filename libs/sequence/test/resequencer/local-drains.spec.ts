import { type ResequencerInput } from '../../src/core/resequence-input';
import { MemoryResequencerStore } from '../../src/adapters/stores/memory/memory.resequencer-store';
import type { ResequencerStore } from '../../src/ports/resequencer-store.port';
import type { Transport } from '../../src/ports/transport.port';
import { LocalDrains, RUNNING_POLL_MS } from '../../src/resequencer/local-drains';
import { Resequencer } from '../../src/resequencer/resequencer';

import { overrideMethods } from '../support/override-methods';
import { resequencerParts } from './resequencer-parts';

const event = (seq: number): ResequencerInput => ({
  body: Buffer.from(`#${seq}`),
  headers: { 'x-resequence-key': 'k', 'x-resequence-seq': seq },
});

/** The store, with its calls counted (the store itself answers them). */
function counted(store: ResequencerStore) {
  const calls = { accept: 0, claimDrain: 0 };
  const wrapped = overrideMethods(store, {
    accept: async (...args: Parameters<ResequencerStore['accept']>) => {
      const outcome = await store.accept(...args);
      calls.accept++;
      return outcome;
    },
    claimDrain: (...args: Parameters<ResequencerStore['claimDrain']>) => {
      calls.claimDrain++;
      return store.claimDrain(...args);
    },
  });
  return { store: wrapped, calls };
}

/** A handler that holds event `seq` until `open()`; records what it was called with. */
function gatedHandler(seq: number) {
  let open!: () => void;
  const gate = new Promise<void>((resolve) => (open = resolve));
  const handled: number[] = [];
  const handler = async (received: { seq: number }) => {
    handled.push(received.seq);
    if (received.seq === seq) await gate;
  };
  return { handler, handled, open };
}

/**
 * Timers frozen (and `Date` with them) unless a test advances them; promise chains and
 * `setImmediate` run as usual. What settles while no timer is advanced was not woken by a timer:
 * not by a safety poll, nor by drainWaitMs.
 */
function freezeTimers(): void {
  jest.useFakeTimers({ doNotFake: ['nextTick', 'setImmediate', 'queueMicrotask'] });
}

/**
 * Lets promise chains run, timers frozen, until `check` holds; fails naming `what` if it does not
 * within a thousand turns of the event loop (the memory store needs a handful).
 */
async function withoutTimers(check: () => boolean, what: string): Promise<void> {
  for (let turn = 0; turn < 1_000; turn++) {
    if (check()) return;
    await new Promise((resolve) => setImmediate(resolve));
  }
  throw new Error(`${what}: not without a timer firing`);
}

/** Lets promise chains run, timers frozen, for a hundred turns of the event loop. */
async function flush(): Promise<void> {
  for (let turn = 0; turn < 100; turn++) await new Promise((resolve) => setImmediate(resolve));
}

/** Whether `promise` has settled, and with what. */
function tracked<T>(promise: Promise<T>): { readonly settled: boolean; readonly value?: T } {
  const state: { settled: boolean; value?: T } = { settled: false };
  void promise.then((value) => Object.assign(state, { settled: true, value }));
  return state;
}

/**
 * An input whose event was released while its key's drain lease was held (a hot key: the next
 * status of a transfer, the next fragment of a streamed sequence) is acked only after that drain
 * delivered it. When the drain runs in this process the input waits for it to end, asking the
 * store nothing meanwhile; when it runs in another instance, the input asks the store at
 * intervals, as before.
 */
describe('Resequencer: inputs waiting on a drain of their key', () => {
  beforeEach(freezeTimers);
  afterEach(() => jest.useRealTimers());

  const resequencer = (store: ResequencerStore, handler: (e: { seq: number }) => unknown) => {
    const { definition, deps } = resequencerParts({
      tuning: { leaseMs: 30_000, drain: { waitMs: 3_000 } },
      handlerRetry: { attempts: 1 },
    });
    return new Resequencer(
      definition,
      { store, ...deps },
      { handler, transport: {} as Transport, reportGap: async () => undefined },
    );
  };

  it('waits for this process’s drain of the key, hardly polling the store, and is acked when it ends', async () => {
    const { store, calls } = counted(new MemoryResequencerStore());
    const { handler, handled, open } = gatedHandler(1);
    const instance = resequencer(store, handler);

    const first = tracked(instance.receive(event(1))); // releases 1 and drains it: held
    await withoutTimers(() => handled.length === 1, 'event 1 in the handler');
    const second = tracked(instance.receive(event(2))); // released behind 1: the lease is busy
    await withoutTimers(() => calls.accept === 2, 'event 2 accepted');
    await flush(); // to its wait
    const claimsWhileHeld = calls.claimDrain;
    // Past one safety poll (RUNNING_POLL_MS) and well before the next.
    await jest.advanceTimersByTimeAsync(RUNNING_POLL_MS + 50);
    // One safety poll; the old 10 ms polling asked the store 30 times by now.
    expect(calls.claimDrain - claimsWhileHeld).toBe(1);
    expect(second.settled).toBe(false); // not acked before its event is delivered

    open();
    // Woken by the drain's end: its next safety poll is a timer, and none fires.
    await withoutTimers(() => first.settled && second.settled, 'both inputs settled');
    expect(first.value).toEqual({ action: 'ack' });
    expect(second.value).toEqual({ action: 'ack' });
    // The drain of event 1 delivered event 2 as well (its settle claimed it), in order.
    expect(handled).toEqual([1, 2]);
  });

  it('still asks the store at intervals when another instance drains the key, and is acked once it has', async () => {
    const shared = new MemoryResequencerStore();
    const { handler, handled, open } = gatedHandler(1);
    const other = resequencer(shared, handler);
    const { store, calls } = counted(shared);
    const here = resequencer(store, handler);

    const first = tracked(other.receive(event(1)));
    await withoutTimers(() => handled.length === 1, 'event 1 in the other instance’s handler');
    const second = tracked(here.receive(event(2)));
    await withoutTimers(() => calls.accept === 1, 'event 2 accepted here');
    await flush(); // to its wait
    const claimsBefore = calls.claimDrain;
    await jest.advanceTimersByTimeAsync(150);
    // Nothing here can tell it the other drain ended: it asks the store (every 10 ms).
    expect(calls.claimDrain - claimsBefore).toBeGreaterThanOrEqual(3);

    open();
    await withoutTimers(() => first.settled, 'the other instance’s input settled');
    expect(first.value).toEqual({ action: 'ack' });
    // Only its next poll tells this one.
    expect(second.settled).toBe(false);
    await jest.advanceTimersByTimeAsync(10);
    await withoutTimers(() => second.settled, 'this instance’s input settled');
    expect(second.value).toEqual({ action: 'ack' });
    expect(handled).toEqual([1, 2]);
  });

  it('wakes waiting inputs when the drain of their key ends by failing, so they are requeued at once', async () => {
    const { store } = counted(new MemoryResequencerStore());
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    const { definition, deps } = resequencerParts(
      {
        tuning: { leaseMs: 5_000, drain: { waitMs: 3_000 } },
        publish: { retry: { attempts: 1 }, confirmTimeoutMs: 1_000 },
      },
      'out',
    );
    // The broker refuses every publish, after a while for event 1.
    const transport = {
      maxMessageBytes: 1_000_000,
      publish: async (_channel: string, _body: Buffer, headers: Record<string, unknown>) => {
        if (headers['x-resequence-seq'] === 1) await gate;
        throw new Error('simulated: the broker refused it');
      },
    } as unknown as Transport;
    const instance = new Resequencer(
      definition,
      { store, ...deps },
      { transport, reportGap: async () => undefined },
    );

    const first = tracked(instance.receive(event(1)));
    await flush(); // event 1's publish waits on the gate
    const second = tracked(instance.receive(event(2)));
    await flush(); // to its wait
    expect(second.settled).toBe(false);
    open();
    // Woken when the failed drain let the lease go: it claimed the list itself, failed the same
    // way and was requeued, with no timer firing: not its safety poll (RUNNING_POLL_MS), nor
    // drainWaitMs (3 s).
    await withoutTimers(() => first.settled && second.settled, 'both inputs settled');
    expect(first.value).toMatchObject({ action: 'requeue' });
    expect(second.value).toMatchObject({ action: 'requeue' });
  });
});

describe('LocalDrains', () => {
  beforeEach(freezeTimers);
  afterEach(() => jest.useRealTimers());

  it('wakes every waiter of a key when a drain of that key ends, and only of that key', async () => {
    const drains = new LocalDrains();
    drains.begin('a');
    const woken: string[] = [];
    void drains.wait('a', 10, 5_000).then(() => woken.push('a1'));
    void drains.wait('a', 10, 5_000).then(() => woken.push('a2'));
    drains.begin('b');
    void drains.wait('b', 10, 5_000).then(() => woken.push('b'));
    await jest.advanceTimersByTimeAsync(30); // longer than pollMs: a drain runs, they wait for it
    expect(woken).toEqual([]);

    drains.end('a');
    // Woken at once, no timer firing: their safety poll (RUNNING_POLL_MS) has not come.
    await withoutTimers(() => woken.length === 2, 'the waiters of a woken');
    await flush();
    expect(woken.sort()).toEqual(['a1', 'a2']);
    expect(drains.isRunning('a')).toBe(false);
    drains.end('b');
    await withoutTimers(() => woken.length === 3, 'the waiter of b woken');
  });

  /** How long `wait` took, in (frozen) milliseconds: the timers advanced one at a time. */
  async function waited(wait: Promise<void>): Promise<number> {
    const state = tracked(wait);
    const startedAt = Date.now();
    while (!state.settled) await jest.advanceTimersByTimeAsync(1);
    return Date.now() - startedAt;
  }

  it('waits pollMs when no drain of the key runs here, RUNNING_POLL_MS when one does, maxMs at most', async () => {
    const drains = new LocalDrains();
    expect(await waited(drains.wait('k', 20, 5_000))).toBe(20);

    drains.begin('k'); // and never ends: its lease may have lapsed in a handler call
    expect(await waited(drains.wait('k', 20, 5_000))).toBe(RUNNING_POLL_MS);
    expect(await waited(drains.wait('k', 5_000, 40))).toBe(40);
  });

  it('counts drains of one key: the key runs until the last has ended', () => {
    const drains = new LocalDrains();
    drains.begin('k');
    drains.begin('k');
    drains.end('k');
    expect(drains.isRunning('k')).toBe(true);
    drains.end('k');
    expect(drains.isRunning('k')).toBe(false);
  });
});
