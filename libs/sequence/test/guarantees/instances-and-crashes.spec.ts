import { storedChargeOf } from 'nest-sequence/testing';
import { parseFragmentHeaders } from 'nest-sequence/wire';
import { InMemoryTransport, MemorySequenceStore, type HandlerContext } from 'nest-sequence';
import { SequenceLeaseLostError } from 'nest-sequence/ports';
import {
  bytes,
  createSequenceTestApp,
  deadLetters,
  deathReasonOf,
  eventually,
  makeFragments,
  metricValue,
  publishAll,
  shuffled,
  type SequenceTestApp,
} from '../support/sequence-test-app';
import { forgedCopy } from '../support/crc32-forgery';
import { InstrumentedStore } from './instrumented.sequence-store';

/**
 * Guarantees table, rows "store unreachable", "consumer crash" and "several consumer instances",
 * on the embedded defaults: instances are several Nest applications in this process sharing one
 * in-memory transport and one memory store.
 */
describe('guarantees: store outages, crashes and several instances', () => {
  const running = new Set<SequenceTestApp>();
  afterEach(async () => {
    for (const app of running) await stop(app);
  });
  const start = async (...args: Parameters<typeof createSequenceTestApp>) => {
    const app = await createSequenceTestApp(...args);
    running.add(app);
    return app;
  };
  const stop = async (app: SequenceTestApp) => {
    running.delete(app);
    await app.close();
  };
  const fragmentsReceived = (app: SequenceTestApp, channel: string) =>
    metricValue(app.metrics.registry, 'nest_sequence_fragments_received_total', { channel });

  describe('store unreachable', () => {
    it('requeues every fragment it cannot store, acks none, and completes the sequence once the store is back', async () => {
      const channel = 'guarantees.outage.accept';
      const store = new InstrumentedStore(new MemorySequenceStore());
      // The shortest requeue delay: at any moment each fragment is queued, in the consumer's
      // hands, or waiting out its delay.
      const t = await start(channel, {
        sequence: { store },
        tuning: { backpressureDelayMs: 1 },
      });
      const payload = bytes(4_000, 51);
      store.unreachable = true;

      await publishAll(t.transport, channel, makeFragments('outage', payload, 1_000));
      await eventually(() => store.refusedAccepts >= 4 * 3, 'every fragment refused three times');
      for (let turn = 0; turn < 20; turn++) {
        const { transport } = t;
        const held =
          transport.depth(channel) + transport.unsettled(channel) + transport.delayed(channel);
        expect(held).toBe(4);
        await new Promise((resolve) => setImmediate(resolve));
      }
      expect(deadLetters(t.transport, channel)).toHaveLength(0);
      expect(t.handler.calls).toBe(0);
      expect(await store.stats(Date.now())).toMatchObject({ openSequences: 0, bufferedBytes: 0 });

      store.unreachable = false;
      await t.transport.whenIdle();

      expect(t.handler.calls).toBe(1);
      expect(t.handler.of('outage')[0].bytes.equals(payload)).toBe(true);
      expect(deadLetters(t.transport, channel)).toHaveLength(0);
      expect(t.transport.depth(channel) + t.transport.unsettled(channel)).toBe(0);
    });

    it('requeues the completing fragment when the verifying read-back fails, and delivers the sequence once on redelivery', async () => {
      const channel = 'guarantees.outage.read';
      const store = new InstrumentedStore(new MemorySequenceStore());
      const t = await start(channel, {
        sequence: { store },
      });
      const payload = bytes(3_000, 52);
      store.failNextReads = 1;

      // Out of order, so the payload is verified by reading it back before the handler.
      const fragments = makeFragments('read-fails', payload, 1_000).reverse();
      await publishAll(t.transport, channel, fragments);
      await t.transport.whenIdle();

      expect(store.failNextReads).toBe(0);
      expect(store.accepts.filter((a) => a.status === 'complete')).toHaveLength(2);
      expect(t.handler.calls).toBe(1);
      expect(t.handler.of('read-fails')[0].bytes.equals(payload)).toBe(true);
      expect(deadLetters(t.transport, channel)).toHaveLength(0);
    });
    it("requeues the completing fragment when the handler's read fails, instead of retrying the handler or dead-lettering; delivers once on redelivery", async () => {
      const channel = 'guarantees.outage.handler-read';
      const store = new InstrumentedStore(new MemorySequenceStore());
      const t = await start(channel, {
        sequence: { store },
      });
      const payload = bytes(3_000, 54);
      store.failNextReads = 1;

      // In order on one instance: verified at intake, so the handler's read is the first one.
      await publishAll(t.transport, channel, makeFragments('handler-read-fails', payload, 1_000));
      await t.transport.whenIdle();

      expect(store.failNextReads).toBe(0);
      expect(store.accepts.filter((a) => a.status === 'complete')).toHaveLength(2);
      expect(t.handler.calls).toBe(2);
      expect(t.handler.of('handler-read-fails')).toHaveLength(1);
      expect(t.handler.of('handler-read-fails')[0].bytes.equals(payload)).toBe(true);
      expect(deadLetters(t.transport, channel)).toHaveLength(0);
    });
  });

  describe('consumer crash', () => {
    it('redelivers the fragments a consumer held when it went away; a restarted consumer completes the sequence from them and the stored ones', async () => {
      const channel = 'guarantees.crash.mid-sequence';
      const transport = new InMemoryTransport();
      const shared = new MemorySequenceStore();
      const crashing = new InstrumentedStore(shared);
      // Fragments of 1,000 bytes: a maxFragmentBytes that keeps the prefetch at 16, so that the
      // three fragments below are in the consumer's hands at once.
      // It goes away with fragments in hand: its shutdown gives up on them after
      // shutdownTimeoutMs (the default, 10 s, would only make the test wait).
      const first = await start(channel, {
        transport,
        shutdownTimeoutMs: 100,
        handler: { maxFragmentBytes: 64 * 1024 },
        sequence: { store: crashing },
      });
      const payload = bytes(5_000, 53);
      const fragments = makeFragments('crash-mid', payload, 1_000);
      await publishAll(transport, channel, fragments.slice(0, 2));
      await transport.whenIdle();
      expect(await shared.stats(Date.now())).toMatchObject({
        openSequences: 1,
        bufferedBytes: storedChargeOf(1_000, 1_000),
      });

      crashing.holdAccepts();
      await publishAll(transport, channel, fragments.slice(2));
      await eventually(() => transport.unsettled(channel) === 3, '3 fragments in hand, unsettled');
      await stop(first);
      crashing.crash();

      const returned = transport.peek(channel);
      expect(returned.map((m) => m.headers['x-sequence-position']).sort()).toEqual([3, 4, 5]);
      expect(returned.every((m) => m.redelivered)).toBe(true);

      const second = await start(channel, {
        transport,
        sequence: { store: shared },
      });
      await transport.whenIdle();

      expect(first.handler.calls).toBe(0);
      expect(second.handler.calls).toBe(1);
      expect(second.handler.of('crash-mid')[0].bytes.equals(payload)).toBe(true);
      expect(await fragmentsReceived(second, channel)).toBe(3);
      expect(await shared.stats(Date.now())).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
      expect(deadLetters(transport, channel)).toHaveLength(0);
    });

    it('redelivers the completing fragment of a consumer that died in its handler; another delivers the sequence once the lease lapses', async () => {
      const channel = 'guarantees.crash.in-handler';
      const transport = new InMemoryTransport();
      const shared = new MemorySequenceStore();
      const dying = new InstrumentedStore(shared);
      // It goes away in its handler: its shutdown gives up on the call after shutdownTimeoutMs.
      const first = await start(channel, {
        transport,
        shutdownTimeoutMs: 100,
        handler: { handlerRetry: { attempts: 1 } },
        sequence: { store: dying },
        tuning: { leaseMs: 100 },
      });
      let endHeldCall: (error: Error) => void = () => undefined;
      let heldCall: HandlerContext | undefined;
      first.handler.onCall = (_payload, context) => {
        heldCall = context;
        return new Promise((_resolve, reject) => (endHeldCall = reject));
      };
      const payload = bytes(3_000, 54);
      const fragments = makeFragments('crash-in-handler', payload, 1_000);

      await publishAll(transport, channel, fragments);
      await eventually(() => first.handler.calls === 1, 'the first consumer in its handler');
      // Not acked while the handler runs.
      expect(transport.unsettled(channel)).toBe(1);
      dying.crash();
      await stop(first);
      await eventually(() => transport.depth(channel) === 1, 'the completing fragment back');
      expect(transport.peek(channel).map((m) => m.headers['x-sequence-position'])).toEqual([3]);

      const second = await start(channel, {
        transport,
        sequence: { store: shared },
        tuning: { leaseMs: 100 },
      });
      await transport.whenIdle();

      expect(second.handler.calls).toBe(1);
      expect(second.handler.of('crash-in-handler')[0].bytes.equals(payload)).toBe(true);

      // With its store gone, the dead consumer could not renew its lease: its call was asked to
      // stop, and what the call does after that is not recorded.
      expect(heldCall?.signal.reason).toBeInstanceOf(SequenceLeaseLostError);
      endHeldCall(new Error('process gone'));
      await new Promise((resolve) => setTimeout(resolve, 50));
      expect(dying.refusedAfterCrash).not.toContain('finish');
      await publishAll(transport, channel, [fragments[0]]);
      await transport.whenIdle();

      expect(first.handler.deliveries).toHaveLength(0);
      expect(second.handler.calls).toBe(1);
      expect(deadLetters(transport, channel)).toHaveLength(0);
    });
  });

  describe('several consumer instances', () => {
    it('deliver each of 20 sequences exactly once across three instances, storing fragments of one sequence on several of them', async () => {
      const channel = 'guarantees.instances.three';
      const transport = new InMemoryTransport();
      const shared = new MemorySequenceStore();
      const stores = [0, 1, 2].map(() => new InstrumentedStore(shared));
      const instances: SequenceTestApp[] = [];
      for (const store of stores)
        instances.push(
          await start(channel, {
            transport,
            sequence: { store },
          }),
        );
      const sequences = Array.from({ length: 20 }, (_, i) => ({
        id: `multi-${i}`,
        payload: bytes(1_000 + i * 250, 60 + i),
      }));

      await publishAll(
        transport,
        channel,
        shuffled(
          sequences.flatMap(({ id, payload }) => makeFragments(id, payload, 500)),
          61,
        ),
      );
      await transport.whenIdle();

      for (const { id, payload } of sequences) {
        const deliveries = instances.flatMap((instance) => instance.handler.of(id));
        expect(deliveries).toHaveLength(1);
        expect(deliveries[0].bytes.equals(payload)).toBe(true);
      }
      const completed = await Promise.all(
        instances.map((instance) =>
          metricValue(instance.metrics.registry, 'nest_sequence_sequences_completed_total', {
            channel,
          }),
        ),
      );
      expect(completed.reduce((sum, n) => sum + n, 0)).toBe(20);
      for (const instance of instances) {
        expect(await fragmentsReceived(instance, channel)).toBeGreaterThan(0);
      }
      const spread = sequences.filter(
        ({ id }) => stores.filter((store) => store.storedPositions(id).length > 0).length > 1,
      );
      expect(spread.length).toBeGreaterThanOrEqual(10);
      // Every fragment was stored exactly once, by one instance or another.
      for (const { id, payload } of sequences) {
        const positions = stores
          .flatMap((store) => store.storedPositions(id))
          .sort((a, b) => a - b);
        expect(positions).toEqual(
          Array.from({ length: Math.ceil(payload.length / 500) }, (_, i) => i + 1),
        );
      }
      expect(deadLetters(transport, channel)).toHaveLength(0);
    });

    // Regression: an instance that lost its lease mid-handler must not overwrite the verdict of
    // the delivery that took over: its call is asked to stop, and its late result is dropped.
    it('delivers once, by the delivery that took over, when the first instance loses its lease mid-handler', async () => {
      const channel = 'guarantees.instances.lapsed-lease';
      const transport = new InMemoryTransport();
      const shared = new MemorySequenceStore();
      const blipping = new InstrumentedStore(shared);
      // prefetch 1: while the first instance holds the completing fragment, others go elsewhere.
      const first = await start(channel, {
        transport,
        handler: { handlerRetry: { attempts: 1 }, prefetch: 1 },
        sequence: { store: blipping },
        tuning: { leaseMs: 100 },
      });
      let releaseFirstCall: () => void = () => undefined;
      let firstCall: HandlerContext | undefined;
      // Its first call works on, heedless of its signal, until the test releases it.
      first.handler.onCall = (_payload, context) => {
        if (first.handler.calls > 1) return Promise.resolve();
        firstCall = context;
        return new Promise<void>((resolve) => (releaseFirstCall = resolve));
      };
      const payload = bytes(3_000, 55);
      const fragments = makeFragments('lapsed', payload, 1_000);
      await publishAll(transport, channel, fragments);
      await eventually(() => first.handler.calls === 1, 'the first instance in its handler');

      blipping.failRenewals = true;
      const second = await start(channel, {
        transport,
        sequence: { store: shared },
        tuning: { leaseMs: 100 },
      });
      await eventually(() => firstCall!.signal.aborted, 'the first call asked to stop');
      expect(firstCall!.signal.reason).toBeInstanceOf(SequenceLeaseLostError);
      blipping.failRenewals = false;
      await publishAll(transport, channel, [fragments[0]]); // the producer resends one
      const deliveries = () => [...first.handler.of('lapsed'), ...second.handler.of('lapsed')];
      await eventually(() => deliveries().length === 1, 'the takeover');
      expect(deliveries()[0].bytes.equals(payload)).toBe(true);

      releaseFirstCall();
      await transport.whenIdle();
      expect(deliveries()).toHaveLength(1);

      expect(deadLetters(transport, channel).map(deathReasonOf)).toEqual([]);
      expect(
        await metricValue(first.metrics.registry, 'nest_sequence_sequences_rejected_total', {
          channel,
        }),
      ).toBe(0);
    });

    // Regression: within ONE instance (prefetch > 1) two deliveries of a sequence are two lease
    // holders; the one that lost its lease cannot overwrite the verdict of the one that took over.
    it('keeps the verdict of a takeover by a second delivery in the same instance', async () => {
      const channel = 'guarantees.instances.same-process-takeover';
      const transport = new InMemoryTransport();
      const blipping = new InstrumentedStore(new MemorySequenceStore());
      const t = await start(channel, {
        transport,
        // 1,000-byte fragments: a maxFragmentBytes to match, so that prefetchBytes leaves the 4.
        handler: { handlerRetry: { attempts: 1 }, prefetch: 4, maxFragmentBytes: 64 * 1024 },
        sequence: { store: blipping },
        tuning: { leaseMs: 100 },
      });
      // Call 1 is held past its lease (asked to stop, heedless), then throws; call 2 (the
      // takeover) is held until call 1 has thrown.
      const release: Array<() => void> = [];
      const contexts: HandlerContext[] = [];
      t.handler.onCall = (_payload, context) => {
        contexts.push(context);
        return new Promise<void>((resolve) => release.push(resolve));
      };
      const payload = bytes(3_000, 56);
      const fragments = makeFragments('same-process', payload, 1_000);
      await publishAll(transport, channel, fragments);
      await eventually(() => t.handler.calls === 1, 'the first delivery in its handler');

      blipping.failRenewals = true;
      await eventually(() => contexts[0].signal.aborted, 'the first delivery asked to stop');
      blipping.failRenewals = false;
      await publishAll(transport, channel, [fragments[0]]); // the producer resends one
      await eventually(() => t.handler.calls === 2, 'the takeover in the same instance');

      t.handler.failNext = 1;
      release[0](); // the stale call fails while the takeover is still running
      await new Promise((resolve) => setTimeout(resolve, 20));
      expect(transport.unsettled(channel)).toBe(1); // the takeover's alone
      release[1]();
      await transport.whenIdle();

      expect(t.handler.of('same-process')).toHaveLength(1);
      expect(t.handler.of('same-process')[0].bytes.equals(payload)).toBe(true);
      expect(deadLetters(transport, channel).map(deathReasonOf)).toEqual([]);
      expect(
        await metricValue(t.metrics.registry, 'nest_sequence_sequences_rejected_total', {
          channel,
        }),
      ).toBe(0);
      // The store's verdict is the takeover's: a late copy meets a `completed` marker.
      const late = {
        ...parseFragmentHeaders(fragments[1].headers),
        scope: channel,
        body: fragments[1].body,
      };
      expect(
        await blipping.accept(late, {
          now: Date.now(),
          consumerId: 'late-copy',
          leaseMs: 100,
          expiry: { ms: 60_000, strategy: 'fixed' },
          retentionMs: 60_000,
          limits: {
            maxSequenceBytes: 1e6,
            maxFragments: 10,
            maxBufferedBytes: 1e7,
            maxOpenSequences: 10,
          },
        }),
      ).toMatchObject({ status: 'finished', outcome: 'completed' });
    });

    // Regression: a copy that takes over a complete sequence stores nothing, so the instance it
    // reaches must not count it in the digest of what it stored: the body the store holds at
    // that position may be another (here, forged with the same CRC-32 by another producer).
    it("reads back a sequence taken over by a copy of its last fragment, and never hands another instance's forged body to the handler", async () => {
      const channel = 'guarantees.instances.takeover-forged';
      const shared = new MemorySequenceStore();
      const a = await start(channel, { sequence: { store: shared } });
      // Instance B, on a broker of its own: its verifying read fails, so it gives the lease back
      // and its message waits a minute to come back.
      const handingBack = new InstrumentedStore(shared);
      const b = await start(channel, {
        sequence: { store: handingBack },
        tuning: { backpressureDelayMs: 60_000 },
      });
      const payload = bytes(4_000, 57);
      const fragments = makeFragments('takeover-forged', payload, 1_000);
      const forged = forgedCopy(fragments[3]);
      expect(forged.body.equals(fragments[3].body)).toBe(false);

      await publishAll(a.transport, channel, fragments.slice(0, 3));
      await a.transport.whenIdle();
      handingBack.failNextReads = 1;
      await publishAll(b.transport, channel, [forged]);
      await eventually(
        () => handingBack.failNextReads === 0 && b.transport.delayed(channel) === 1,
        'B to hand the completed sequence back',
      );
      expect(b.handler.calls).toBe(0);

      // The genuine last fragment reaches A, which stored 1 to 3 in order: a copy of what is
      // stored at 4 (the same CRC-32), it takes the sequence over.
      await publishAll(a.transport, channel, [fragments[3]]);
      await a.transport.whenIdle();

      expect(a.handler.calls).toBe(0);
      const dead = deadLetters(a.transport, channel);
      expect(dead).toHaveLength(1);
      expect(deathReasonOf(dead[0])).toMatch(/^integrity-mismatch: sequence takeover-forged/);
    });
  });
});
