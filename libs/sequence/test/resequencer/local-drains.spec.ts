import { type ResequencerInput } from '../../src/core/resequence-input';
import { MemoryResequencerStore } from '../../src/adapters/stores/memory/memory.resequencer-store';
import type { ResequencerStore } from '../../src/ports/resequencer-store.port';
import type { Disposition, Transport } from '../../src/ports/transport.port';
import { LocalDrains, RUNNING_POLL_MS } from '../../src/resequencer/local-drains';
import { Resequencer } from '../../src/resequencer/resequencer';

import { overrideMethods } from '../support/override-methods';
import { eventually } from '../support/sequence-test-app';
import { resequencerParts, sleep } from './resequencer-parts';

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
 * An input whose event was released while its key's drain lease was held (a hot key: the next
 * status of a transfer, the next fragment of a streamed sequence) is acked only after that drain
 * delivered it. When the drain runs in this process the input waits for it to end, asking the
 * store nothing meanwhile; when it runs in another instance, the input asks the store at
 * intervals, as before.
 */
describe('Resequencer: inputs waiting on a drain of their key', () => {
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

    const first = instance.receive(event(1)); // releases 1 and drains it: held in the handler
    await eventually(() => handled.length === 1, 'event 1 in the handler');
    const second = instance.receive(event(2)); // released behind 1: the key's lease is busy
    await eventually(() => calls.accept === 2, 'event 2 accepted');
    const claimsWhileHeld = calls.claimDrain;
    let secondSettled: Disposition | undefined;
    void second.then((disposition) => (secondSettled = disposition));
    // Past one safety poll (RUNNING_POLL_MS) and well before the next.
    await sleep(RUNNING_POLL_MS + 50);
    // The old 10 ms polling asked the store about 30 times by now.
    expect(calls.claimDrain - claimsWhileHeld).toBeLessThanOrEqual(2);
    expect(secondSettled).toBeUndefined(); // not acked before its event is delivered

    const openedAt = Date.now();
    open();
    await expect(first).resolves.toEqual({ action: 'ack' });
    await expect(second).resolves.toEqual({ action: 'ack' });
    // Woken by the drain's end, not by its next safety poll, about 200 ms later.
    expect(Date.now() - openedAt).toBeLessThan(120);
    // The drain of event 1 delivered event 2 as well (its settle claimed it), in order.
    expect(handled).toEqual([1, 2]);
  });

  it('still asks the store at intervals when another instance drains the key, and is acked once it has', async () => {
    const shared = new MemoryResequencerStore();
    const { handler, handled, open } = gatedHandler(1);
    const other = resequencer(shared, handler);
    const { store, calls } = counted(shared);
    const here = resequencer(store, handler);

    const first = other.receive(event(1));
    await eventually(() => handled.length === 1, 'event 1 in the other instance’s handler');
    const second = here.receive(event(2));
    await eventually(() => calls.accept === 1, 'event 2 accepted here');
    const claimsBefore = calls.claimDrain;
    await sleep(150);
    // Nothing here can tell it the other drain ended: it asks the store (every 10 ms).
    expect(calls.claimDrain - claimsBefore).toBeGreaterThanOrEqual(3);

    open();
    await expect(first).resolves.toEqual({ action: 'ack' });
    await expect(second).resolves.toEqual({ action: 'ack' });
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

    const first = instance.receive(event(1));
    await sleep(20);
    const second = instance.receive(event(2));
    await sleep(50);
    const openedAt = Date.now();
    open();
    await expect(first).resolves.toMatchObject({ action: 'requeue' });
    // Woken when the failed drain let the lease go: it claimed the list itself, failed the same
    // way and was requeued, before its safety poll (RUNNING_POLL_MS after it began, about 200 ms
    // from here) and long before drainWaitMs (3 s).
    await expect(second).resolves.toMatchObject({ action: 'requeue' });
    expect(Date.now() - openedAt).toBeLessThan(120);
  });
});

describe('LocalDrains', () => {
  it('wakes every waiter of a key when a drain of that key ends, and only of that key', async () => {
    const drains = new LocalDrains();
    drains.begin('a');
    const woken: string[] = [];
    const a1 = drains.wait('a', 10, 5_000).then(() => woken.push('a1'));
    const a2 = drains.wait('a', 10, 5_000).then(() => woken.push('a2'));
    drains.begin('b');
    const b = drains.wait('b', 10, 5_000).then(() => woken.push('b'));
    await sleep(30); // longer than pollMs: a drain runs, so they wait for it
    expect(woken).toEqual([]);

    const endedAt = Date.now();
    drains.end('a');
    await Promise.all([a1, a2]);
    // Woken at once: their safety poll (RUNNING_POLL_MS after they began) was 200 ms away.
    expect(Date.now() - endedAt).toBeLessThan(100);
    expect(woken.sort()).toEqual(['a1', 'a2']);
    expect(drains.isRunning('a')).toBe(false);
    drains.end('b');
    await b;
  });

  it('waits pollMs when no drain of the key runs here, RUNNING_POLL_MS when one does, maxMs at most', async () => {
    const drains = new LocalDrains();
    let startedAt = Date.now();
    await drains.wait('k', 20, 5_000);
    expect(Date.now() - startedAt).toBeLessThan(RUNNING_POLL_MS);

    drains.begin('k'); // and never ends: its lease may have lapsed in a handler call
    startedAt = Date.now();
    await drains.wait('k', 20, 5_000);
    const waited = Date.now() - startedAt;
    expect(waited).toBeGreaterThanOrEqual(RUNNING_POLL_MS - 5);
    expect(waited).toBeLessThan(2_000);

    startedAt = Date.now();
    await drains.wait('k', 5_000, 40);
    expect(Date.now() - startedAt).toBeLessThan(RUNNING_POLL_MS);
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
