import {
  readAll,
  sequenceFixture,
  storedChargeOf,
  describeSequenceStoreConformance,
} from '../../../testing/conformance/sequence-store.conformance';
import type { AcceptContext } from '../../../ports/sequence-store.port';
import { MemorySequenceStore } from './memory.sequence-store';

const CONSUMER = 'consumer-a';

describeSequenceStoreConformance('memory', { create: async () => new MemorySequenceStore() });

describe('MemorySequenceStore', () => {
  const t0 = 1_000_000;
  let store: MemorySequenceStore;

  beforeEach(() => {
    store = new MemorySequenceStore();
  });

  function context(now: number, overrides: Partial<AcceptContext> = {}): AcceptContext {
    return {
      now,
      consumerId: CONSUMER,
      leaseMs: 30_000,
      expiry: { ms: 60_000, strategy: 'fixed' },
      retentionMs: 1_000,
      limits: {
        maxSequenceBytes: 1_000,
        maxFragments: 100,
        maxBufferedBytes: 10_000,
        maxOpenSequences: 100,
      },
      ...overrides,
    };
  }

  it('is named memory and answers ping', async () => {
    expect(store.name).toBe('memory');
    await expect(store.ping()).resolves.toBeUndefined();
  });

  it('forgets a finished marker after retentionMs: the id then opens a new sequence', async () => {
    const { fragments, ref } = sequenceFixture('scope', ['a', 'b']);
    for (const fragment of fragments) await store.accept(fragment, context(t0));
    await store.finish(ref, 'completed', { now: t0, retentionMs: 1_000, consumerId: CONSUMER });

    expect(await store.accept(fragments[0], context(t0 + 999))).toMatchObject({
      status: 'finished',
    });
    expect(await store.accept(fragments[0], context(t0 + 1_000))).toEqual({
      status: 'stored',
      opened: true,
    });
  });

  it('keeps its own copy of a body: the caller may reuse its buffer', async () => {
    const { fragments, ref } = sequenceFixture('scope', ['abc']);
    const body = Buffer.from('abc');
    await store.accept({ ...fragments[0], body }, context(t0));
    body.write('xyz');

    expect(Buffer.concat(await readAll(store.read(ref))).toString()).toBe('abc');
  });

  it('fails the stream when asked to read a sequence that is not complete', async () => {
    const { fragments, ref } = sequenceFixture('scope', ['a', 'b']);
    await store.accept(fragments[0], context(t0));

    await expect(readAll(store.read(ref))).rejects.toThrow(/not complete/);
    await expect(readAll(store.read({ scope: 'scope', sequenceId: 'unknown' }))).rejects.toThrow(
      /not complete/,
    );
  });

  it("evicts failed sequences' retained fragments before back-pressuring for them", async () => {
    // Room for one of the two sequences below, not for both.
    const limits = { ...context(t0).limits, maxBufferedBytes: 3_000 };
    const failed = sequenceFixture('scope', ['f'.repeat(600)]);
    await store.accept(failed.fragments[0], context(t0, { limits }));
    await store.finish(failed.ref, 'failed', {
      now: t0,
      retentionMs: 60_000,
      consumerId: CONSUMER,
    });
    expect(await store.stats(t0)).toMatchObject({ bufferedBytes: storedChargeOf(600) });

    const next = sequenceFixture('scope', ['n'.repeat(500), 'm']);
    expect(await store.accept(next.fragments[0], context(t0, { limits }))).toEqual({
      status: 'stored',
      opened: true,
    });
    expect(await store.stats(t0)).toMatchObject({ bufferedBytes: storedChargeOf(500) });
    expect(await store.accept(failed.fragments[0], context(t0))).toMatchObject({
      status: 'finished',
      outcome: 'failed',
    });
  });

  it('purges expired markers in listExpired', async () => {
    const { fragments, ref } = sequenceFixture('scope', ['a']);
    await store.accept(fragments[0], context(t0));
    await store.finish(ref, 'rejected', { now: t0, retentionMs: 1_000, consumerId: CONSUMER });

    await store.listExpired(t0 + 1_000, 10);
    expect(await store.accept(fragments[0], context(t0 + 500))).toMatchObject({
      status: 'complete',
    });
  });

  it('close forgets everything', async () => {
    const { fragments } = sequenceFixture('scope', ['a', 'b']);
    await store.accept(fragments[0], context(t0));
    await store.close();

    expect(await store.stats(t0)).toEqual({ openSequences: 0, bufferedBytes: 0, reservedBytes: 0 });
    expect(await store.accept(fragments[0], context(t0))).toEqual({
      status: 'stored',
      opened: true,
    });
  });

  it('forgets markers past retention without any sweep (an instance with sweepIntervalMs: false)', async () => {
    const store = new MemorySequenceStore();
    const scope = 'memory.no-sweeper';
    const context = (now: number, consumerId = CONSUMER) => ({
      now,
      consumerId,
      leaseMs: 1_000,
      expiry: { ms: 60_000, strategy: 'fixed' as const },
      retentionMs: 1_000,
      limits: {
        maxSequenceBytes: 1e6,
        maxFragments: 10,
        maxBufferedBytes: 1e7,
        maxOpenSequences: 1e6,
      },
    });
    const t0 = 1_000_000;
    for (let i = 0; i < 200; i++) {
      const { fragments, ref } = sequenceFixture(scope, ['x']);
      await store.accept(fragments[0], context(t0));
      await store.finish(ref, 'completed', {
        now: t0,
        retentionMs: 1_000,
        consumerId: CONSUMER,
      });
    }
    const markers = (store as unknown as { markers: Map<string, unknown> }).markers;
    expect(markers.size).toBe(200);

    // Traffic after retention (never listExpired) wears the old markers down.
    for (let i = 0; i < 30; i++) {
      await store.accept(sequenceFixture(scope, ['y', 'z']).fragments[0], context(t0 + 5_000));
    }
    expect(markers.size).toBe(0);
  });
});
