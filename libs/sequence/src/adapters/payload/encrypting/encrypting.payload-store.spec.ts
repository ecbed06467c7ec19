import { type PayloadEncryptionKey } from '../../../core/encryption-key';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough, Readable } from 'node:stream';
import {
  describePayloadStoreConformance,
  digestOf,
  digestOfBuffer,
  generatedSource,
} from '../../../testing/conformance/payload-store.conformance';
import { withTimeout } from '../../../core/async';
import { ClaimCheckNotFoundError } from '../../../core/errors/claim-check-not-found.error';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import {
  deleteIfUnpublished,
  type PayloadInfo,
  type PayloadStore,
  type PutOptions,
  type StoredPayload,
  type SweepCandidate,
  type SweepQuery,
} from '../../../ports/payload-store.port';
import { FilesystemPayloadStore } from '../filesystem/filesystem.payload-store';
import { EncryptingPayloadStore } from './encrypting.payload-store';
import {
  PayloadDecryptionError,
  type PayloadDecryptionFailure,
} from '../../../core/errors/payload-decryption.error';

const MIB = 1024 * 1024;
const HEADER = 82;
const TAG = 16;
const OFFSET = { magic: 0, version: 4, keyIdLength: 5, keyId: 6, keyIdPadding: 8, iv: 70 };

const K1: PayloadEncryptionKey = { id: 'k1', key: randomBytes(32) };
const K2: PayloadEncryptionKey = { id: 'k2', key: randomBytes(32) };

/**
 * The store being wrapped: a Map of Buffers. It is the test double for the inner store only;
 * the encryption wrapper around it is what these tests exercise.
 */
class MapPayloadStore implements PayloadStore {
  readonly name = 'map';
  readonly stored = new Map<string, { bytes: Buffer; info: PayloadInfo }>();
  /** How `get` serves stored bytes; tests replace it to control chunking and timing. */
  serve: (bytes: Buffer) => Readable = (bytes) => Readable.from(chunks(bytes, 64 * 1024));
  /** Bytes `put` has received so far, across all puts. */
  received = 0;
  private next = 0;

  async put(payload: Buffer | Readable, options: PutOptions): Promise<StoredPayload> {
    const parts: Buffer[] = [];
    for await (const chunk of Readable.from(payload instanceof Readable ? payload : [payload])) {
      parts.push(chunk as Buffer);
      this.received += (chunk as Buffer).length;
    }
    const bytes = Buffer.concat(parts);
    const ref = `p${(this.next += 1)}`;
    const { now, ...metadata } = options;
    this.stored.set(ref, {
      bytes,
      info: { ref, bytes: bytes.length, createdAt: now, ...metadata },
    });
    return { ref, bytes: bytes.length };
  }

  async get(ref: string): Promise<Readable> {
    const entry = this.stored.get(ref);
    if (!entry) throw new ClaimCheckNotFoundError(this.name, ref);
    return this.serve(entry.bytes);
  }

  async head(ref: string): Promise<PayloadInfo | undefined> {
    return this.stored.get(ref)?.info;
  }

  async delete(ref: string): Promise<boolean> {
    return this.stored.delete(ref);
  }

  async markPublished(ref: string): Promise<boolean> {
    const entry = this.stored.get(ref);
    if (entry) entry.info = { ...entry.info, published: true };
    return entry !== undefined;
  }

  async sweepCandidates(query: SweepQuery): Promise<SweepCandidate[]> {
    return [...this.stored.values()]
      .filter(({ info }) => info.expiresAt <= query.now)
      .map(({ info }) => ({ ref: info.ref, reason: 'expired' as const }));
  }

  async ping(): Promise<void> {}

  async close(): Promise<void> {}

  /** The stored (encrypted) bytes of `ref`, to inspect or alter in place. */
  raw(ref: string): Buffer {
    return this.stored.get(ref)!.bytes;
  }

  replace(ref: string, bytes: Buffer): void {
    this.stored.get(ref)!.bytes = bytes;
  }
}

function* chunks(bytes: Buffer, size: number): Generator<Buffer> {
  for (let offset = 0; offset < bytes.length; offset += size) {
    yield bytes.subarray(offset, offset + size);
  }
}

const options = (): PutOptions => ({ now: 1_000, expiresAt: 2_000, published: false });

async function collect(stream: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const chunk of stream) parts.push(chunk as Buffer);
  return Buffer.concat(parts);
}

/** How reading a stream to its end went: an error instead of `end`, or a clean end. */
async function readOutcome(stream: Readable): Promise<{ ended: boolean; error?: unknown }> {
  let ended = false;
  stream.on('end', () => (ended = true));
  try {
    for await (const _chunk of stream) {
      // Drained only.
    }
    return { ended };
  } catch (error) {
    return { ended, error };
  }
}

/** The reason `get(ref)` or the stream it resolved failed with, or `'read cleanly'`. */
async function failureOf(
  store: PayloadStore,
  ref: string,
): Promise<PayloadDecryptionFailure | 'read cleanly'> {
  let stream: Readable;
  try {
    stream = await store.get(ref);
  } catch (error) {
    return (error as PayloadDecryptionError).reason;
  }
  const outcome = await readOutcome(stream);
  if (outcome.error === undefined) return 'read cleanly';
  expect(outcome.ended).toBe(false);
  expect(outcome.error).toBeInstanceOf(PayloadDecryptionError);
  return (outcome.error as PayloadDecryptionError).reason;
}

async function until(condition: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await new Promise((resolve) => setImmediate(resolve));
  }
}

describe('EncryptingPayloadStore', () => {
  let inner: MapPayloadStore;
  let store: EncryptingPayloadStore;

  beforeEach(() => {
    inner = new MapPayloadStore();
    store = new EncryptingPayloadStore(inner, { keys: [K1] });
  });

  describe('round trip', () => {
    it.each([
      ['an empty Buffer', 0],
      ['a 1-byte Buffer', 1],
      ['a 300 KiB Buffer', 300 * 1024 + 5],
    ])('gives back %s and reports its plaintext size', async (_label, size) => {
      const payload = randomBytes(size);

      const stored = await store.put(payload, options());

      expect(stored.bytes).toBe(size);
      expect((await store.head(stored.ref))?.bytes).toBe(size);
      expect(await digestOf(await store.get(stored.ref))).toEqual(digestOfBuffer(payload));
    });

    it.each([
      ['an empty stream', 0],
      ['a 12 MiB stream', 12 * MIB + 7],
    ])('gives back %s, streamed both ways', async (_label, size) => {
      const source = generatedSource(size);

      const stored = await store.put(source.stream, options());

      expect(stored.bytes).toBe(size);
      expect(await digestOf(await store.get(stored.ref))).toEqual(source.digest());
    });

    it('stores only ciphertext, 98 bytes longer than the plaintext', async () => {
      const payload = Buffer.from('patient: Jane Doe; '.repeat(1_000));

      const { ref } = await store.put(payload, options());

      expect(inner.raw(ref).length).toBe(payload.length + HEADER + TAG);
      expect(inner.raw(ref).includes('Jane Doe')).toBe(false);
    });

    it('encrypts the same plaintext differently every time (a fresh IV per payload)', async () => {
      const payload = Buffer.alloc(1_000, 7);

      const first = await store.put(payload, options());
      const second = await store.put(payload, options());

      const ivOf = (ref: string) => inner.raw(ref).subarray(OFFSET.iv, HEADER);
      expect(ivOf(first.ref)).not.toEqual(ivOf(second.ref));
      expect(inner.raw(first.ref).subarray(HEADER)).not.toEqual(
        inner.raw(second.ref).subarray(HEADER),
      );
    });

    it('decrypts when the stored bytes arrive one byte at a time (header and tag split)', async () => {
      const payload = randomBytes(300);
      const { ref } = await store.put(payload, options());
      inner.serve = (bytes) => Readable.from(chunks(bytes, 1));

      expect(await digestOf(await store.get(ref))).toEqual(digestOfBuffer(payload));
    });

    it('passes get of a ref the inner store does not hold through as ClaimCheckNotFoundError', async () => {
      await expect(store.get('p404')).rejects.toBeInstanceOf(ClaimCheckNotFoundError);
    });
  });

  describe('streaming', () => {
    it('put hands encrypted bytes to the inner store before the source has ended', async () => {
      const source = new PassThrough();
      const putting = store.put(source, options());

      source.write(randomBytes(MIB));
      await until(() => inner.received >= HEADER + MIB, 'the first MiB reached the inner store');
      source.end(randomBytes(10));

      expect((await putting).bytes).toBe(MIB + 10);
    });

    it('get releases plaintext before the inner store has sent the rest', async () => {
      const payload = randomBytes(2 * MIB);
      const { ref } = await store.put(payload, options());
      let sendRest = (): void => undefined;
      inner.serve = (bytes) => {
        const served = new PassThrough();
        served.write(bytes.subarray(0, MIB));
        sendRest = () => served.end(bytes.subarray(MIB));
        return served;
      };

      const reading = (await store.get(ref))[Symbol.asyncIterator]();
      const first = await withTimeout(
        reading.next(),
        5_000,
        () => new Error('no plaintext before the inner stream ended'),
      );
      sendRest();
      const parts = [first.value as Buffer];
      for (let next = await reading.next(); !next.done; next = await reading.next()) {
        parts.push(next.value as Buffer);
      }

      // Digests: jest compares big Buffers byte by byte, very slowly.
      expect(digestOfBuffer(Buffer.concat(parts))).toEqual(digestOfBuffer(payload));
    });
  });

  describe('tampering', () => {
    let ref: string;

    beforeEach(async () => {
      ({ ref } = await store.put(randomBytes(MIB), options()));
    });

    function flip(offset: number): void {
      const bytes = inner.raw(ref);
      bytes[offset < 0 ? bytes.length + offset : offset] ^= 0x01;
    }

    it.each([
      ['the magic', OFFSET.magic, 'malformed-header'],
      ['the format version', OFFSET.version, 'malformed-header'],
      ['the key id length', OFFSET.keyIdLength, 'malformed-header'],
      ['the key id padding', OFFSET.keyIdPadding, 'malformed-header'],
      // 'k1' becomes 'k0': well-formed, but no such key.
      ['the key id', OFFSET.keyId + 1, 'unknown-key'],
    ])('makes get reject when a byte of %s changed', async (_label, offset, reason) => {
      flip(offset);

      const error = await store.get(ref).catch((caught: unknown) => caught);

      expect(error).toBeInstanceOf(PayloadDecryptionError);
      expect(error).toMatchObject({ reason, ref, store: 'map' });
    });

    it.each([
      ['the IV', OFFSET.iv + 5],
      ['the first ciphertext byte', HEADER],
      ['a ciphertext byte in the middle', HEADER + MIB / 2],
      ['the last ciphertext byte', -TAG - 1],
      ['the tag', -1],
    ])('makes the stream error instead of ending when a byte of %s changed', async (_l, offset) => {
      flip(offset);

      expect(await failureOf(store, ref)).toBe('authentication-failed');
    });

    it('makes the stream error when the stored bytes lost their last byte', async () => {
      inner.replace(ref, inner.raw(ref).subarray(0, -1));

      expect(await failureOf(store, ref)).toBe('authentication-failed');
    });

    it('makes the stream error when a byte was appended', async () => {
      inner.replace(ref, Buffer.concat([inner.raw(ref), Buffer.from([0])]));

      expect(await failureOf(store, ref)).toBe('authentication-failed');
    });

    it('reports truncation when the stored bytes end inside the tag or the header', async () => {
      const whole = Buffer.from(inner.raw(ref));

      inner.replace(ref, whole.subarray(0, HEADER + TAG - 1));
      expect(await failureOf(store, ref)).toBe('truncated');
      inner.replace(ref, whole.subarray(0, HEADER - 1));
      expect(await failureOf(store, ref)).toBe('truncated');
    });

    it('never reads cleanly once any single byte of a small payload changed', async () => {
      const small = await store.put(randomBytes(40), options());
      const original = Buffer.from(inner.raw(small.ref));
      const cleanReads: number[] = [];

      for (let offset = 0; offset < original.length; offset += 1) {
        const altered = Buffer.from(original);
        altered[offset] ^= 0x80;
        inner.replace(small.ref, altered);
        if ((await failureOf(store, small.ref)) === 'read cleanly') cleanReads.push(offset);
      }

      expect(original.length).toBe(40 + HEADER + TAG);
      expect(cleanReads).toEqual([]);
    });
  });

  describe('keys', () => {
    it('reads a payload written before a new key was put first (rotation)', async () => {
      const payload = randomBytes(10_000);
      const { ref } = await store.put(payload, options());

      const rotated = new EncryptingPayloadStore(inner, { keys: [K2, K1] });

      expect(await digestOf(await rotated.get(ref))).toEqual(digestOfBuffer(payload));
    });

    it('encrypts new payloads under the first key', async () => {
      const rotated = new EncryptingPayloadStore(inner, { keys: [K2, K1] });
      const { ref } = await rotated.put(Buffer.from('new'), options());

      const onlyK2 = new EncryptingPayloadStore(inner, { keys: [K2] });
      const onlyK1 = new EncryptingPayloadStore(inner, { keys: [K1] });

      expect(await collect(await onlyK2.get(ref))).toEqual(Buffer.from('new'));
      await expect(onlyK1.get(ref)).rejects.toMatchObject({ reason: 'unknown-key', keyId: 'k2' });
    });

    it('rejects get of a payload under a key id it does not hold, naming the key id', async () => {
      const { ref } = await store.put(Buffer.from('secret'), options());
      const other = new EncryptingPayloadStore(inner, { keys: [K2] });

      const error = await other.get(ref).catch((caught: unknown) => caught);

      expect(error).toBeInstanceOf(PayloadDecryptionError);
      expect(error).toMatchObject({ reason: 'unknown-key', keyId: 'k1', ref });
    });

    it('fails authentication when the key id maps to other key material', async () => {
      const { ref } = await store.put(randomBytes(5_000), options());
      const wrongKey = new EncryptingPayloadStore(inner, {
        keys: [{ id: 'k1', key: randomBytes(32) }],
      });

      expect(await failureOf(wrongKey, ref)).toBe('authentication-failed');
    });

    it('takes a key as base64 or base64url of the same 32 bytes', async () => {
      const key = K1.key as Buffer;
      const { ref } = await store.put(Buffer.from('either way'), options());

      for (const text of [key.toString('base64'), key.toString('base64url')]) {
        const fromText = new EncryptingPayloadStore(inner, { keys: [{ id: 'k1', key: text }] });
        expect(await collect(await fromText.get(ref))).toEqual(Buffer.from('either way'));
      }
    });

    function problemsOf(keys: readonly PayloadEncryptionKey[]): readonly string[] {
      try {
        new EncryptingPayloadStore(inner, { keys });
      } catch (error) {
        if (error instanceof SequenceOptionsError) return error.problems;
        throw error;
      }
      throw new Error('expected a SequenceOptionsError');
    }

    it.each([
      ['a 31-byte Buffer', randomBytes(31)],
      ['a 33-byte Buffer', randomBytes(33)],
      ['base64 of 31 bytes', randomBytes(31).toString('base64')],
      ['a 32-character passphrase', 'correct horse battery staple 123'],
      ['32 bytes in hex', randomBytes(32).toString('hex')],
    ])('refuses %s as a key', (_label, key) => {
      expect(problemsOf([{ id: 'k', key }])).toEqual([
        expect.stringMatching(/^key "k": key must be 32 bytes/),
      ]);
    });

    it('refuses an empty key list', () => {
      expect(problemsOf([])).toEqual([expect.stringMatching(/at least one key/)]);
    });

    it.each([
      ['no options', undefined],
      ['null', null],
      ['a key list without its object', [K1]],
    ])('refuses %s with a typed error naming the options it takes', (_label, options) => {
      const construct = () => new EncryptingPayloadStore(inner, options as never);
      expect(construct).toThrow(SequenceOptionsError);
      expect(construct).toThrow(/options must be an object: \{ keys: \[\{ id, key \}\] \}/);
    });

    it('refuses a missing inner store with a typed error, together with bad options', () => {
      const construct = () => new EncryptingPayloadStore(undefined as never, undefined as never);
      expect(construct).toThrow(SequenceOptionsError);
      expect(construct).toThrow(/the store to wrap must be a PayloadStore[\s\S]*options must be/);
    });

    it('reports a duplicate id and a bad id together', () => {
      expect(problemsOf([K1, { ...K2, id: 'k1' }, { ...K2, id: 'x'.repeat(65) }])).toEqual([
        expect.stringMatching(/key "k1": the id is used twice/),
        expect.stringMatching(/: id must be 1-64 characters/),
      ]);
    });
  });

  describe('everything but the bytes', () => {
    it('carries the inner store name, so tickets do not change', () => {
      expect(store.name).toBe('map');
    });

    it('passes head, markPublished, sweepCandidates and delete through', async () => {
      const { ref } = await store.put(Buffer.from('abc'), {
        ...options(),
        contentType: 'text/plain',
      });

      expect(await store.markPublished(ref)).toBe(true);
      expect(await store.head(ref)).toEqual({
        ref,
        bytes: 3,
        createdAt: 1_000,
        expiresAt: 2_000,
        published: true,
        contentType: 'text/plain',
      });
      expect(await store.sweepCandidates({ now: 2_000, unpublishedBefore: 0, limit: 10 })).toEqual([
        { ref, reason: 'expired' },
      ]);
      expect(await store.delete(ref)).toBe(true);
      expect(await store.head(ref)).toBeUndefined();
    });

    it('has no deleteUnpublished around a store without one: the sweeper falls back to head', async () => {
      expect('deleteUnpublished' in inner).toBe(false);
      expect('deleteUnpublished' in store).toBe(false);
      expect(store.deleteUnpublished).toBeUndefined();
      const orphan = await store.put(Buffer.from('orphan'), options());
      const sent = await store.put(Buffer.from('sent'), { ...options(), published: true });

      expect(await deleteIfUnpublished(store, sent.ref)).toBe(false);
      expect(await deleteIfUnpublished(store, orphan.ref)).toBe(true);
      expect([...inner.stored.keys()]).toEqual([sent.ref]);
    });

    it("passes deleteUnpublished through to a store that has one, with that store's answer", async () => {
      /** The inner store with a check-and-delete of its own, recording the refs it was given. */
      class AtomicMapPayloadStore extends MapPayloadStore {
        readonly deletesUnpublished: string[] = [];

        async deleteUnpublished(ref: string): Promise<boolean> {
          this.deletesUnpublished.push(ref);
          const entry = this.stored.get(ref);
          return entry !== undefined && !entry.info.published && this.stored.delete(ref);
        }
      }
      const atomic = new AtomicMapPayloadStore();
      const wrapper = new EncryptingPayloadStore(atomic, { keys: [K1] });
      const orphan = await wrapper.put(Buffer.from('orphan'), options());
      const sent = await wrapper.put(Buffer.from('sent'), { ...options(), published: true });
      const head = jest.spyOn(atomic, 'head');

      expect(await wrapper.deleteUnpublished?.(sent.ref)).toBe(false);
      expect(await wrapper.deleteUnpublished?.(orphan.ref)).toBe(true);
      expect(await deleteIfUnpublished(wrapper, orphan.ref)).toBe(false);
      expect(atomic.deletesUnpublished).toEqual([sent.ref, orphan.ref, orphan.ref]);
      // The inner store decided alone: no head-then-delete of the fallback.
      expect(head).not.toHaveBeenCalled();
      expect([...atomic.stored.keys()]).toEqual([sent.ref]);
    });
  });
});

describe('EncryptingPayloadStore around the filesystem store', () => {
  /** One directory per run; each store gets a root inside it, removed with it after the run. */
  let workspace: string;

  beforeAll(async () => {
    workspace = await mkdtemp(join(tmpdir(), 'nseq-encrypted-payloads-'));
  });

  afterAll(async () => {
    await rm(workspace, { recursive: true, force: true });
  });

  describePayloadStoreConformance('encrypting(filesystem)', {
    create: async () =>
      new EncryptingPayloadStore(
        new FilesystemPayloadStore({ root: join(workspace, randomUUID()) }),
        {
          keys: [K2, K1],
        },
      ),
  });

  // Around a store of your own without deleteUnpublished, the wrapper has none either: its race
  // case passes at once, as it does for that store, instead of racing a head-then-delete.
  describePayloadStoreConformance('encrypting(filesystem without deleteUnpublished)', {
    create: async () => {
      const bare = Object.create(
        new FilesystemPayloadStore({ root: join(workspace, randomUUID()) }),
      ) as PayloadStore;
      Object.defineProperty(bare, 'deleteUnpublished', { value: undefined });
      return new EncryptingPayloadStore(bare, { keys: [K1] });
    },
  });
});
