import {
  readAll,
  sequenceFixture,
  storedChargeOf,
  describeSequenceStoreConformance,
} from '../../../testing/conformance/sequence-store.conformance';
import { randomBytes } from 'node:crypto';
import type { AcceptContext } from '../../../ports/sequence-store.port';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { StoredFragmentDecryptionError } from '../../../core/errors/stored-fragment-decryption.error';
import { StoredFragmentIntegrityError } from '../../../core/errors/stored-fragment-integrity.error';
import { MemorySequenceStore } from './memory.sequence-store';
import type { HeldSequence } from './memory-sequence';

const CONSUMER = 'consumer-a';
const ENCRYPTION = { keys: [{ id: 'k1', key: randomBytes(32) }] };

describeSequenceStoreConformance('memory', { create: async () => new MemorySequenceStore() });
describeSequenceStoreConformance('memory (encrypted)', {
  create: async () => new MemorySequenceStore({ encryption: ENCRYPTION }),
});

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

  it('says the fragment that completed a sequence was stored, and a copy taking it over was not', async () => {
    const { fragments, ref } = sequenceFixture('scope', ['a', 'b']);
    await store.accept(fragments[0], context(t0));

    expect(await store.accept(fragments[1], context(t0))).toMatchObject({
      status: 'complete',
      opened: false,
      stored: true,
    });
    await store.releaseLease(ref, CONSUMER, t0 + 1);
    const copy = { ...fragments[1], body: Buffer.from('B') };
    expect(await store.accept(copy, context(t0 + 1, { consumerId: 'consumer-b' }))).toMatchObject({
      status: 'complete',
      opened: false,
      stored: false,
    });
    expect(Buffer.concat(await readAll(store.read(ref))).toString()).toBe('ab');
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

  describe('with encryption', () => {
    const SECRET = 'patient: Jane Doe';
    let encrypted: MemorySequenceStore;

    beforeEach(() => {
      encrypted = new MemorySequenceStore({ encryption: ENCRYPTION });
    });

    /** The sequences the store holds (its internals: what a heap dump would show). */
    function held(): HeldSequence[] {
      return [...(encrypted as unknown as { held: Map<string, HeldSequence> }).held.values()];
    }

    it('holds bodies and user headers sealed, and reads the plaintext back', async () => {
      const { fragments, ref, payload } = sequenceFixture('scope', [SECRET, `${SECRET}!`], {
        userHeaders: { patient: SECRET },
      });
      let result;
      for (const fragment of fragments) result = await encrypted.accept(fragment, context(t0));

      const [sequence] = held();
      const kept = [...sequence.bodies.values(), sequence.userHeaders as Buffer];
      expect(kept.every((bytes) => Buffer.isBuffer(bytes))).toBe(true);
      expect(kept.filter((bytes) => bytes.includes('Jane Doe'))).toEqual([]);
      expect(result).toMatchObject({
        status: 'complete',
        sequence: { userHeaders: { patient: SECRET } },
      });
      expect(Buffer.concat(await readAll(encrypted.read(ref)))).toEqual(payload);
    });

    it('counts the plaintext against the budget, as without encryption', async () => {
      const { fragments } = sequenceFixture('scope', ['abc', 'defg']);
      await encrypted.accept(fragments[0], context(t0));
      await encrypted.accept(fragments[1], context(t0));

      expect((await encrypted.stats(t0)).bufferedBytes).toBe(storedChargeOf(3, 4));
    });

    it('fails the read with an integrity error when a held body was altered', async () => {
      const { fragments, ref } = sequenceFixture('scope', ['first body', 'second body']);
      for (const fragment of fragments) await encrypted.accept(fragment, context(t0));
      // A byte of the ciphertext (after the 82 header bytes).
      held()[0].bodies.get(2)![90] ^= 0x01;

      const error = await readAll(encrypted.read(ref)).catch((caught: unknown) => caught);

      expect(error).toBeInstanceOf(StoredFragmentIntegrityError);
      expect(error).toBeInstanceOf(StoredFragmentDecryptionError);
      expect(error).toMatchObject({ position: 2, reason: 'authentication-failed', keyId: 'k1' });
    });

    it('fails the read when two held bodies were swapped (each is bound to its position)', async () => {
      const { fragments, ref } = sequenceFixture('scope', ['same length 1', 'same length 2']);
      for (const fragment of fragments) await encrypted.accept(fragment, context(t0));
      const { bodies } = held()[0];
      const [one, two] = [bodies.get(1)!, bodies.get(2)!];
      bodies.set(1, two);
      bodies.set(2, one);

      await expect(readAll(encrypted.read(ref))).rejects.toMatchObject({
        position: 1,
        reason: 'authentication-failed',
      });
    });

    it('reports user headers that do not open as the sequence integrity failure', async () => {
      const { fragments } = sequenceFixture('scope', ['a', 'b'], { userHeaders: { x: '1' } });
      await encrypted.accept(fragments[0], context(t0));
      (held()[0].userHeaders as Buffer)[90] ^= 0x01;

      const result = await encrypted.accept(fragments[1], context(t0));

      expect(result).toMatchObject({
        status: 'complete',
        sequence: {
          userHeaders: {},
          integrityFailure: expect.stringMatching(/user headers .* did not decrypt/),
        },
      });
    });

    it('refuses a key that is not 32 bytes at construction', () => {
      expect(
        () => new MemorySequenceStore({ encryption: { keys: [{ id: 'k', key: 'short' }] } }),
      ).toThrow(SequenceOptionsError);
    });
  });
});
