import { MemorySequenceStore, type HandlerContext } from 'nest-sequence';
import { SequenceLeaseLostError, type SequenceRef, type SequenceStore } from 'nest-sequence/ports';
import { SettlementRecordingTransport } from '../claim-check/claim-check-test-app';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  eventually,
  makeFragments,
  publishAll,
  type SequenceTestApp,
} from '../support/sequence-test-app';

const LEASE_MS = 600;

/** How the store answers the renewals of a completion lease while a test says so. */
type Renewals = 'answer' | 'taken' | 'silent';

/** A memory store whose lease renewals answer as `renewals()` says, the rest as they are. */
function storeRenewing(renewals: () => Renewals): SequenceStore {
  const store = new MemorySequenceStore();
  return new Proxy(store, {
    get(target, property, receiver): unknown {
      if (property !== 'renewLease') return Reflect.get(target, property, receiver);
      return (ref: SequenceRef, holder: string, leaseMs: number, now: number) => {
        const answer = renewals();
        // Another delivery took the lease over: the store says so.
        if (answer === 'taken') return Promise.resolve(false);
        // A store that stopped answering (a lost reply, no command timeout).
        if (answer === 'silent') return new Promise<boolean>(() => undefined);
        return target.renewLease(ref, holder, leaseMs, now);
      };
    },
  });
}

/**
 * Message Sequence, store-buffered: the completion lease of a complete sequence is renewed while
 * its handler runs. Once it may belong to another delivery (a renewal finds it taken, or none
 * has confirmed it for most of `tuning.leaseMs`), the handler's signal aborts with a
 * `SequenceLeaseLostError`, no outcome is recorded for that call, and the completing fragment is
 * requeued: its redelivery takes the sequence over and handles it.
 */
describe('guarantees: a completion lease lost while the handler runs', () => {
  let t: SequenceTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  async function boot(channel: string, renewals: () => Renewals) {
    const transport = new SettlementRecordingTransport();
    t = await createSequenceTestApp(channel, {
      transport,
      sequence: { store: storeRenewing(renewals) },
      tuning: { leaseMs: LEASE_MS, backpressureDelayMs: 10 },
      handler: { handlerRetry: { attempts: 3, baseDelayMs: 1, maxDelayMs: 1 } },
    });
    return { app: t, transport };
  }

  it.each([
    ['a renewal finds it taken', 'taken', 'taken'],
    ['no renewal answers', 'silent', 'unconfirmed'],
  ] as const)(
    'asks the handler to stop when %s, records nothing, and the redelivery handles it',
    async (_how, failure, why) => {
      const channel = `guarantees.lease-lost.${failure}`;
      let renewals: Renewals = 'answer';
      const { app, transport } = await boot(channel, () => renewals);
      const contexts: HandlerContext[] = [];
      app.handler.onCall = async (_payload, context) => {
        contexts.push(context);
        if (contexts.length > 1) return;
        // The first call works until it is told to stop, and returns then (too late to count).
        renewals = failure;
        await new Promise((resolve) => context.signal.addEventListener('abort', resolve));
        renewals = 'answer';
      };
      const payload = bytes(3_000, 17);
      await publishAll(transport, channel, makeFragments('lease-lost', payload, 1_000));

      await eventually(
        () => contexts.length === 2 && app.handler.deliveries.length === 1,
        'the redelivery handled',
        5_000,
      );
      await transport.whenIdle();

      const reason: unknown = contexts[0].signal.reason;
      expect(reason).toBeInstanceOf(SequenceLeaseLostError);
      expect(reason).toMatchObject({
        code: 'sequence-lease-lost',
        channel,
        sequenceId: 'lease-lost',
        why,
      });
      // Not retried under the lost lease: the second call is the redelivery's, with a fresh lease.
      expect(contexts[1].attempt).toBe(1);
      expect(contexts[1].signal.aborted).toBe(false);
      expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
      // The completing fragment: requeued once, then acked by the delivery that took it over.
      expect(transport.actionsOn(channel).slice(-2)).toEqual(['requeue', 'ack']);
      expect(deadLetters(transport, channel)).toHaveLength(0);
      expect(
        await app.store.status!({ scope: channel, sequenceId: 'lease-lost' }, Date.now()),
      ).toMatchObject({ state: 'finished', outcome: 'completed' });
    },
  );

  it('keeps a lease whose renewals answer: a handler working for several leases is not stopped', async () => {
    const channel = 'guarantees.lease-lost.kept';
    const { app, transport } = await boot(channel, () => 'answer');
    const contexts: HandlerContext[] = [];
    app.handler.onCall = async (_payload, context) => {
      contexts.push(context);
      await new Promise((resolve) => setTimeout(resolve, 3 * LEASE_MS));
    };
    await publishAll(transport, channel, makeFragments('lease-kept', bytes(2_000, 5), 1_000));

    await eventually(() => app.handler.deliveries.length === 1, 'handled', 5_000);
    await transport.whenIdle();

    expect(contexts).toHaveLength(1);
    expect(contexts[0].signal.aborted).toBe(false);
    expect(transport.actionsOn(channel)).toEqual(['ack', 'ack']);
  });
});
