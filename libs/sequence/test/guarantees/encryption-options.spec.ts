import { randomBytes } from 'node:crypto';
import {
  MemoryResequencerStore,
  MemorySequenceStore,
  SequenceOptionsError,
  type SequenceModuleOptions,
} from 'nest-sequence';
import { SEQUENCE_STORE } from '../../src/kernel/tokens';
import type { SequenceStore } from '../../src/ports/sequence-store.port';
import { sequenceFixture } from '../../src/testing/conformance/sequence-store.conformance';
import { createTestApp } from '../support/test-app';

/** `sequence.encryption` and `resequencer.encryption`: keys for the default stores, checked at boot. */
describe('guarantees: the encryption module options', () => {
  async function bootFailure(options: SequenceModuleOptions): Promise<SequenceOptionsError> {
    const error: unknown = await createTestApp({ sequence: options, logger: false }).then(
      async (t) => {
        await t.close();
        return undefined;
      },
      (rejection: unknown) => rejection,
    );
    expect(error).toBeInstanceOf(SequenceOptionsError);
    return error as SequenceOptionsError;
  }

  it('refuses a key that is not 32 bytes at boot, naming the option', async () => {
    const error = await bootFailure({
      sequence: { encryption: { keys: [{ id: 'k', key: Buffer.alloc(16) }] } },
    });

    expect(error.problems).toEqual([
      expect.stringMatching(/^sequence\.encryption: key "k": key must be 32 bytes/),
    ]);
  });

  it('refuses keys beside a store of your own, which it could not reach', async () => {
    const error = await bootFailure({
      sequence: {
        store: new MemorySequenceStore(),
        encryption: { keys: [{ id: 'k', key: randomBytes(32) }] },
      },
    });

    expect(error.problems).toEqual([
      expect.stringMatching(/^sequence\.encryption configures the default sequence store only/),
    ]);
  });

  it('refuses a bad resequencer.encryption key, and keys beside a resequencer store of your own', async () => {
    const badKey = await bootFailure({
      resequencer: { encryption: { keys: [{ id: 'k', key: 'not base64 of 32 bytes' }] } },
    });
    const besideStore = await bootFailure({
      resequencer: {
        store: new MemoryResequencerStore(),
        encryption: { keys: [{ id: 'k', key: randomBytes(32) }] },
      },
    });

    expect(badKey.problems).toEqual([
      expect.stringMatching(/^resequencer\.encryption: key "k": key must be 32 bytes/),
    ]);
    expect(besideStore.problems).toEqual([
      expect.stringMatching(
        /^resequencer\.encryption configures the default resequencer store only/,
      ),
    ]);
  });

  it('gives the keys to the default store, which then holds bodies sealed', async () => {
    const t = await createTestApp({
      sequence: { sequence: { encryption: { keys: [{ id: 'k', key: randomBytes(32) }] } } },
      logger: false,
    });
    try {
      const store = t.app.get<SequenceStore>(SEQUENCE_STORE);
      const { fragments } = sequenceFixture('scope', ['patient: Jane Doe', 'second']);
      await store.accept(fragments[0], {
        now: 1_000,
        consumerId: 'c',
        leaseMs: 1_000,
        expiry: { ms: 60_000, strategy: 'fixed' },
        retentionMs: 1_000,
        limits: {
          maxSequenceBytes: 1e6,
          maxFragments: 10,
          maxBufferedBytes: 1e7,
          maxOpenSequences: 10,
        },
      });

      const held = [
        ...(
          store as unknown as { held: Map<string, { bodies: Map<number, Buffer> }> }
        ).held.values(),
      ];
      const body = held[0].bodies.get(1) as Buffer;
      expect(body.length).toBe('patient: Jane Doe'.length + 98);
      expect(body.includes('Jane Doe')).toBe(false);
    } finally {
      await t.close();
    }
  });
});
