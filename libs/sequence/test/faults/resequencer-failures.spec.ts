import type { ResequencerStore } from 'nest-sequence';
import { heldEntryBytes } from '../../src/ports/resequencer-store.port';
import { overrideMethods } from '../support/override-methods';
import { refuseEveryPublish } from './support/broker-policy';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';
import { createResequencerApp, type ResequencerApp } from './support/resequencer-app';
import { QueueCollector } from './support/resequencer-output';

jest.setTimeout(30_000);

const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;

/** An input requeued because the store did not answer (the test app's back-pressure delay). */
const STORE_UNAVAILABLE = {
  action: 'requeue',
  delayMs: 50,
  reason: 'resequencer store unavailable',
} as const;

const event = (seq: number) => ({
  body: Buffer.from(`K#${seq}`),
  headers: { 'x-resequence-key': 'K', 'x-resequence-seq': seq },
});

/** `store`, with `method` failing while `state.failing` is set, as while Redis does not answer. */
function failingWhile(
  store: ResequencerStore,
  method: 'accept' | 'settleDrain',
  state: { failing: boolean },
): ResequencerStore {
  const original = store[method].bind(store) as (...args: unknown[]) => Promise<unknown>;
  return overrideMethods(store, {
    [method]: (...args: unknown[]) =>
      state.failing
        ? Promise.reject(new Error(`simulated: Redis did not answer ${method}`))
        : original(...args),
  });
}

/**
 * The Resequencer's failure paths on RabbitMQ and Redis, through `ResequencerService.create`, so
 * that each input's disposition (what its consumer would do with the broker delivery) is seen
 * directly: nothing is acknowledged that the store does not hold or that was not delivered.
 */
describeOnRealServers('faults: a Resequencer whose store or output fails', () => {
  let t: ResequencerApp | undefined;
  const servers = useFaultServers({
    beforeCleanup: async () => {
      await t?.close();
      t = undefined;
    },
  });

  /**
   * An app whose store's `method` fails while the returned `state.failing` is set (it starts
   * set), and a resequencer on a fresh channel whose handler records the sequences it gets.
   */
  async function withFailing(method: 'accept' | 'settleDrain') {
    const state = { failing: true };
    t = await createResequencerApp(undefined, {
      prefix: servers.prefix,
      wrapStore: (store) => failingWhile(store, method, state),
    });
    const handled: number[] = [];
    const resequencer = t.service.create(
      { channel: servers.admin.newChannel(), gap: GAP },
      (received) => {
        handled.push(received.seq);
      },
    );
    return { state, handled, resequencer };
  }

  it('store failing to accept (as when Redis is unreachable): the input is requeued, not acked, and nothing is delivered; once it answers, the key delivers in order', async () => {
    const { state, handled, resequencer } = await withFailing('accept');

    await expect(resequencer.receive(event(1))).resolves.toEqual(STORE_UNAVAILABLE);
    expect(handled).toEqual([]);

    state.failing = false;
    await expect(resequencer.receive(event(2))).resolves.toEqual({ action: 'ack' });
    expect(handled).toEqual([]);
    // The requeued input comes back: now it is stored, releases 1-2, and is acked once delivered.
    await expect(resequencer.receive(event(1))).resolves.toEqual({ action: 'ack' });
    expect(handled).toEqual([1, 2]);
    await resequencer.settled(); // the trim that follows the ack
    await expect(resequencer.inspect('K')).resolves.toEqual({
      next: 3,
      buffered: [],
      handOff: 0,
    });
  });

  it("store failing to settle a drain: the input is acked once its event is delivered; the key's next drain delivers the unsettled event again, then the next one, in order", async () => {
    const { state, handled, resequencer } = await withFailing('settleDrain');

    // Released and delivered: acked. The trim of the hand-off list that follows fails.
    await expect(resequencer.receive(event(1))).resolves.toEqual({ action: 'ack' });
    await resequencer.settled();
    expect(handled).toEqual([1]);
    await expect(resequencer.inspect('K')).resolves.toEqual({
      next: 2,
      buffered: [],
      handOff: 1,
      heldBytes: heldEntryBytes({ seq: 1, ...event(1) }),
    });

    state.failing = false;
    // At least once: the delivered but unsettled event goes again before the key's next one.
    await expect(resequencer.receive(event(2))).resolves.toEqual({ action: 'ack' });
    await resequencer.settled();
    expect(handled).toEqual([1, 1, 2]);
    await expect(resequencer.inspect('K')).resolves.toEqual({
      next: 3,
      buffered: [],
      handOff: 0,
    });
  });

  it('output refused by the broker: the drain stops, the event stays at the head of the hand-off list and its input is requeued; then the key delivers in order', async () => {
    const channel = servers.admin.newChannel();
    const output = servers.admin.newChannel();
    const published = new QueueCollector(servers.admin, output);
    t = await createResequencerApp(undefined, { prefix: servers.prefix });
    const resequencer = t.service.create({ channel, output, gap: GAP });
    const seqs = async () =>
      (await published.collect()).map((message) => message.headers['x-resequence-seq']);

    const allow = await refuseEveryPublish(output);
    let allowed = false;
    try {
      await expect(resequencer.receive(event(1))).resolves.toEqual({
        action: 'requeue',
        delayMs: 50,
        reason: 'key K: output unreachable',
      });
      // Released, not delivered: it waits at the head of the hand-off list.
      await expect(resequencer.inspect('K')).resolves.toEqual({
        next: 2,
        buffered: [],
        handOff: 1,
        heldBytes: heldEntryBytes({ seq: 1, ...event(1) }),
      });
      await expect(resequencer.receive(event(3))).resolves.toEqual({ action: 'ack' });
      expect(await seqs()).toEqual([]);
      await allow();
      allowed = true;
    } finally {
      if (!allowed) await allow();
    }

    // The requeued input comes back: late now, but its event is still pending; it drains it.
    await expect(resequencer.receive(event(1))).resolves.toEqual({ action: 'ack' });
    await expect(resequencer.receive(event(2))).resolves.toEqual({ action: 'ack' });
    await published.atLeast(3, 'the three events on the output');
    expect(await seqs()).toEqual([1, 2, 3]);
    expect((await published.collect()).map((message) => message.body.toString())).toEqual([
      'K#1',
      'K#2',
      'K#3',
    ]);
    await expect(resequencer.inspect('K')).resolves.toEqual({
      next: 4,
      buffered: [],
      handOff: 0,
    });
  });
});
