import { RedisResequencerStore } from 'nest-sequence/redis';
import {
  type DrainClaim,
  type DrainContext,
  type HandOffItem,
  type ResequencerKey,
} from 'nest-sequence/ports';
import { type ResequencerStore } from 'nest-sequence';
import { overrideMethods } from '../support/override-methods';
import { eventually } from '../support/sequence-test-app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';
import { createResequencerApp, type ResequencerApp } from './support/resequencer-app';

jest.setTimeout(30_000);

const LEASE_MS = 300;
const GAP = { timeoutMs: 60_000, policy: 'alert' } as const;
const LIMITS = { maxBufferedPerKey: 100, maxBufferedTotal: 1_000 };

/**
 * This instance's lease calls (`claimDrain`, and `renewDrain`: the drain lease's renewals) fail
 * while `failing` is set, as they would while Redis does not answer in time; what the others
 * answer is recorded.
 */
class FailingClaims {
  failing = false;
  readonly answered: Array<DrainClaim | boolean> = [];

  wrap(store: ResequencerStore): ResequencerStore {
    const claimDrain = async (key: ResequencerKey, context: DrainContext) => {
      if (this.failing) throw new Error('simulated: Redis did not answer in time');
      const claim = await store.claimDrain(key, context);
      this.answered.push(claim);
      return claim;
    };
    const renewDrain = async (
      key: ResequencerKey,
      holder: string,
      leaseMs: number,
      now: number,
    ) => {
      if (this.failing) throw new Error('simulated: Redis did not answer in time');
      const renewed = await store.renewDrain(key, holder, leaseMs, now);
      this.answered.push(renewed);
      return renewed;
    };
    return overrideMethods(store, { claimDrain, renewDrain });
  }
}

/**
 * A drainer that is alive but whose lease lapsed (its renewals failed for longer than leaseMs):
 * another instance takes the key over. Whatever the first drainer does once it is back, it must
 * neither deliver nor settle anything of the hand-off list any more: the list's head is no
 * longer its batch.
 */
describeOnRealServers('faults: a Resequencer drainer whose lease lapsed while it was alive', () => {
  let t: ResequencerApp | undefined;
  const servers = useFaultServers({
    beforeCleanup: async () => {
      await t?.close();
      t = undefined;
    },
  });

  it('never settles (trims) events another instance released after taking its lease over', async () => {
    const channel = servers.admin.newChannel();
    const claims = new FailingClaims();
    t = await createResequencerApp(undefined, {
      prefix: servers.prefix,
      leaseMs: LEASE_MS,
      wrapStore: (store) => claims.wrap(store),
    });
    let openGate!: () => void;
    const gate = new Promise<void>((resolve) => (openGate = resolve));
    const handled: number[] = [];
    const resequencer = t.service.create({ channel, gap: GAP }, async (event) => {
      handled.push(event.seq);
      if (event.seq === 2) await gate;
    });
    const event = (seq: number) => ({
      body: Buffer.from(`K#${seq}`),
      headers: { 'x-resequence-key': 'K', 'x-resequence-seq': seq },
    });
    const ref = { scope: channel, key: 'K' };
    // What the other instance uses: the same Redis, its own client.
    const other = new RedisResequencerStore(servers.redis, { prefix: servers.prefix });

    await expect(resequencer.receive(event(1))).resolves.toEqual({ action: 'ack' });
    await expect(resequencer.receive(event(3))).resolves.toEqual({ action: 'ack' });
    // Releases 2-3; this instance claims them and hangs in the handler on 2.
    const receivingTwo = resequencer.receive(event(2));
    await eventually(() => handled.includes(2), 'the handler on event 2');

    claims.failing = true;
    await new Promise((resolve) => setTimeout(resolve, LEASE_MS + 100));
    // The lease lapsed: the other instance takes the key over, delivers 2 and 3, settles, and
    // lets go; then it releases 4 (and has not claimed it yet).
    const drainer = { holder: 'other-instance', leaseMs: LEASE_MS, limit: 32 };
    const takeover = await other.claimDrain(ref, { ...drainer, now: Date.now() });
    expect(takeover.kind === 'claimed' && takeover.items.map(seqOf)).toEqual([2, 3]);
    await expect(other.settleDrain(ref, 2, { ...drainer, now: Date.now() })).resolves.toEqual({
      kind: 'empty',
    });
    await expect(
      other.accept(
        ref,
        { seq: 4, body: Buffer.from('K#4'), headers: {} },
        {
          start: 1,
          limits: LIMITS,
          now: Date.now(),
        },
      ),
    ).resolves.toMatchObject({ kind: 'released' });

    // This instance's renewals get through again, then its handler returns.
    claims.failing = false;
    const answeredBefore = claims.answered.length;
    await eventually(() => claims.answered.length > answeredBefore, 'a renewal answered');
    openGate();
    await receivingTwo;

    // Event 4 must still be delivered (here by this instance, the only one with a handler), and
    // 3, delivered by the other instance, not again.
    await eventually(() => handled.includes(4), 'event 4 delivered', 3_000);
    expect(handled).toEqual([1, 2, 4]);
    // Settles are sent a moment after the handler returns (batched per event-loop turn).
    await eventually(async () => (await resequencer.inspect('K')).handOff === 0, 'settled');
    await expect(resequencer.inspect('K')).resolves.toEqual({
      next: 5,
      buffered: [],
      handOff: 0,
    });
  });
});

function seqOf(item: HandOffItem): number | undefined {
  return item.kind === 'event' ? item.entry.seq : undefined;
}
