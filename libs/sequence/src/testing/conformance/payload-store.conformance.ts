import { createHash, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import {
  ClaimCheckNotFoundError,
  InvalidPayloadRefError,
  SequenceOptionsError,
} from '../../core/errors';
import {
  deleteIfUnpublished,
  type PayloadStore,
  type PutOptions,
  type SweepCandidate,
  type SweepQuery,
} from '../../ports/payload-store.port';
import { textOf } from '../../core/errors/caught';

export interface PayloadStoreHarness {
  /** A fresh, empty store (for a server-backed store: under a prefix or bucket of its own). */
  create(): Promise<PayloadStore>;
  /** Closes it and cleans up; `store.close()` when absent. */
  close?(store: PayloadStore): Promise<void>;
  /**
   * `false` for a store whose `deleteUnpublished` re-reads the payload before a plain delete
   * instead of deciding atomically (S3): the case racing it against `markPublished` is skipped.
   * A store without `deleteUnpublished` needs nothing here: that case passes at once for it.
   * @default true
   */
  readonly atomicDeleteUnpublished?: boolean;
}

export interface Digest {
  readonly bytes: number;
  readonly sha256: string;
}

const MINUTE = 60_000;
const MIB = 1024 * 1024;

export function digestOfBuffer(payload: Buffer): Digest {
  return { bytes: payload.length, sha256: createHash('sha256').update(payload).digest('hex') };
}

/** Byte count and SHA-256 of a stream, hashed as it flows (the test never holds it whole). */
export async function digestOf(stream: Readable): Promise<Digest> {
  const hash = createHash('sha256');
  let bytes = 0;
  for await (const chunk of stream as AsyncIterable<unknown>) {
    if (!(chunk instanceof Uint8Array)) throw new Error(`get() streamed a ${typeof chunk} chunk`);
    hash.update(chunk);
    bytes += chunk.length;
  }
  return { bytes, sha256: hash.digest('hex') };
}

export interface GeneratedSource {
  readonly stream: Readable;
  /** What the stream produced so far; final once it ended. */
  digest(): Digest;
}

/** Irregular chunk sizes, so no store can get away with assuming aligned writes. */
const CHUNK_SIZES = [65_536, 1, 100_003, 7, 262_144, 4_096];

/**
 * A Readable of `total` random bytes made as it is read (never held whole), yielding to the event
 * loop now and then so that concurrent puts interleave. With `failWith`, it throws that error once
 * `failAfter` bytes were produced.
 */
export function generatedSource(
  total: number,
  failure?: { readonly failAfter: number; readonly failWith: Error },
): GeneratedSource {
  const hash = createHash('sha256');
  let produced = 0;
  let final: Digest | undefined;
  async function* generate(): AsyncGenerator<Buffer> {
    for (let index = 0; produced < total; index += 1) {
      if (failure && produced >= failure.failAfter) throw failure.failWith;
      const chunk = randomBytes(
        Math.min(CHUNK_SIZES[index % CHUNK_SIZES.length], total - produced),
      );
      hash.update(chunk);
      produced += chunk.length;
      yield chunk;
      if (index % 4 === 3) await new Promise((resolve) => setImmediate(resolve));
    }
    if (failure) throw failure.failWith;
  }
  return {
    stream: Readable.from(generate()),
    digest: () => (final ??= { bytes: produced, sha256: hash.digest('hex') }),
  };
}

/** `code` of a refusal this suite accepts for a ref, or a description of what came instead. */
function refusalOf(error: unknown): string {
  if (error instanceof ClaimCheckNotFoundError || error instanceof InvalidPayloadRefError) {
    return error.code;
  }
  return error instanceof Error ? `unexpected ${error.name}: ${error.message}` : textOf(error);
}

const REFUSALS = ['claim-check-not-found', 'invalid-payload-ref'];

async function rejectionOf(promise: Promise<unknown>): Promise<unknown> {
  try {
    const value = await promise;
    if (value instanceof Readable) value.destroy();
    return new Error(`resolved ${value instanceof Readable ? 'a stream' : String(value)}`);
  } catch (error) {
    return error;
  }
}

/** Refs no store generates, aimed at paths, keys and parsers. Only ever used for reads here. */
const HOSTILE_REFS: ReadonlyArray<readonly [string, string]> = [
  ['a relative climb to /etc/passwd', '../../etc/passwd'],
  ['a deep relative climb', '../'.repeat(40) + 'etc/passwd'],
  ['an absolute path', '/etc/passwd'],
  ['the parent directory', '..'],
  ['the current directory', '.'],
  ['the empty string', ''],
  ['a climb hidden mid-path', 'a/../../b'],
  ['a climb after a date-like prefix', '2026/01/01/../../../../etc/passwd'],
  ['backslashes', '..\\..\\etc\\passwd'],
  ['percent-encoding', '%2e%2e%2f%2e%2e%2fetc%2fpasswd'],
  ['doubled dots', '....//....//etc/passwd'],
  ['a NUL byte', 'abc\0../../etc/passwd'],
  ['a trailing NUL', '/etc/passwd\0'],
  ['a newline', 'a\nb'],
  ['a glob', '*'],
  ['a Redis hash-tag and pattern', '{x}:*'],
  ['a very long ref', 'a'.repeat(10_000)],
  ['a very long path', 'a/'.repeat(5_000)],
];

/** Variants of a real ref that a lenient parser would map back to it. They must not reach it. */
const DERIVED_REFS: ReadonlyArray<readonly [string, (ref: string) => string]> = [
  ['prefixed with ./', (ref) => `./${ref}`],
  ['prefixed with /', (ref) => `/${ref}`],
  ['prefixed with .\\', (ref) => `.\\${ref}`],
  ['with a trailing /', (ref) => `${ref}/`],
  ['with /. appended', (ref) => `${ref}/.`],
  ['reached through x/..', (ref) => `x/../${ref}`],
  ['with a NUL appended', (ref) => `${ref}\0`],
  ['with a NUL and a climb appended', (ref) => `${ref}\0/../x`],
  ['padded with spaces', (ref) => ` ${ref} `],
  ['with a newline appended', (ref) => `${ref}\n`],
  ['with .json appended', (ref) => `${ref}.json`],
  ['with .meta.json appended', (ref) => `${ref}.meta.json`],
  ['with .tmp appended', (ref) => `${ref}.tmp`],
  ['with :0 appended', (ref) => `${ref}:0`],
  ['with :meta appended', (ref) => `${ref}:meta`],
];

/**
 * Content types no ticket carries and no HTTP header can (S3 sends it as `Content-Type`): `put`
 * refuses them all, whatever the store, before it writes anything.
 */
const UNFIT_CONTENT_TYPES: ReadonlyArray<readonly [string, unknown]> = [
  ['a Latin-1 letter', 'application/dicom; charset=ü'],
  ['a character beyond Latin-1', 'text/plain; name=報告'],
  ['a line break and a header after it', 'text/plain\r\nx-amz-acl: public-read'],
  ['a NUL', 'text/plain\0'],
  ['a tab', 'text/plain;\tcharset=utf-8'],
  ['the empty string', ''],
  ['a leading space', ' text/plain'],
  ['256 characters', `application/${'x'.repeat(244)}`],
  ['a number', 42],
];

/**
 * The behaviour every {@link PayloadStore} adapter must show, clause by clause of the port's doc
 * comment. Time is passed in (`now`); every `expiresAt` lies in the real future so that stores
 * which also set server-side expiry keep the payloads for the length of a test, and sweeps look
 * ahead instead of back. Each test gets a fresh store.
 */
export function describePayloadStoreConformance(name: string, harness: PayloadStoreHarness): void {
  describe(`PayloadStore conformance: ${name}`, () => {
    let store: PayloadStore;
    let t0: number;

    beforeEach(async () => {
      store = await harness.create();
      t0 = Date.now();
    });

    afterEach(async () => {
      await (harness.close ? harness.close(store) : store.close());
    });

    const options = (overrides: Partial<PutOptions> = {}): PutOptions => ({
      now: t0,
      expiresAt: t0 + 30 * MINUTE,
      published: false,
      ...overrides,
    });

    /** A query that finds every payload a store holds (nothing is published at creation). */
    const everything = (): SweepQuery => ({
      now: t0 + 365 * 24 * 60 * MINUTE,
      unpublishedBefore: t0 + 365 * 24 * 60 * MINUTE,
      limit: 1_000,
    });

    async function read(ref: string): Promise<Digest> {
      return digestOf(await store.get(ref));
    }

    /** A ref this store could have generated but does not hold: one from another store. */
    async function foreignRef(): Promise<string> {
      const other = await harness.create();
      try {
        return (await other.put(Buffer.from('elsewhere'), options())).ref;
      } finally {
        await (harness.close ? harness.close(other) : other.close());
      }
    }

    it('has a name for tickets and answers ping', async () => {
      expect(store.name).toMatch(/^[a-z0-9-]+$/);
      await expect(store.ping()).resolves.toBeUndefined();
    });

    describe('put and get', () => {
      it.each([
        ['an empty Buffer', 0],
        ['a 1-byte Buffer', 1],
        ['a 300 KiB Buffer', 300 * 1024 + 17],
      ])('return the exact bytes of %s', async (_label, size) => {
        const payload = randomBytes(size);

        const stored = await store.put(payload, options());

        expect(stored.bytes).toBe(size);
        expect(await read(stored.ref)).toEqual(digestOfBuffer(payload));
      });

      it.each([
        ['an empty stream', 0],
        ['a 1-byte stream', 1],
        ['a 6 MiB stream made by a generator', 6 * MIB + 3],
      ])('return the exact bytes of %s', async (_label, size) => {
        const source = generatedSource(size);

        const stored = await store.put(source.stream, options());

        expect(stored.bytes).toBe(size);
        expect(await read(stored.ref)).toEqual(source.digest());
      });

      it('streams the same payload to every get', async () => {
        const payload = randomBytes(70_000);
        const { ref } = await store.put(payload, options());

        const [first, second] = await Promise.all([read(ref), read(ref)]);

        expect(first).toEqual(digestOfBuffer(payload));
        expect(second).toEqual(digestOfBuffer(payload));
      });

      it('generates a different ref for every put, even of the same bytes', async () => {
        const payload = Buffer.from('same bytes');

        const first = await store.put(payload, options());
        const second = await store.put(payload, options());

        expect(first.ref).not.toBe(second.ref);
        await store.delete(first.ref);
        expect(await read(second.ref)).toEqual(digestOfBuffer(payload));
      });

      it('keeps concurrent puts apart', async () => {
        const sizes = [0, 1, 2, 1_000, 65_536, 65_537, 200_000, 333_333, 12, 4_096, 99_999, 7];
        const sources = sizes.map((size, index) =>
          index % 2 === 0 ? generatedSource(size) : { buffer: randomBytes(size) },
        );

        const stored = await Promise.all(
          sources.map((source) =>
            store.put('buffer' in source ? source.buffer : source.stream, options()),
          ),
        );

        expect(new Set(stored.map((one) => one.ref)).size).toBe(sizes.length);
        const digests = await Promise.all(stored.map((one) => read(one.ref)));
        expect(digests).toEqual(
          sources.map((source) =>
            'buffer' in source ? digestOfBuffer(source.buffer) : source.digest(),
          ),
        );
      });
    });

    describe('a failed put', () => {
      it('rejects with the error of a source stream that fails mid-way', async () => {
        const cause = new Error('source broke after 1 MiB');
        const source = generatedSource(4 * MIB, { failAfter: MIB, failWith: cause });

        const error = await rejectionOf(store.put(source.stream, options()));

        expect(error === cause ? error : (error as Error).cause).toBe(cause);
      });

      it.each([
        [
          'fails mid-way',
          () => generatedSource(3 * MIB, { failAfter: MIB, failWith: new Error('x') }),
        ],
        ['fails at once', () => generatedSource(MIB, { failAfter: 0, failWith: new Error('x') })],
        [
          'fails after its last byte',
          () => generatedSource(1_000, { failAfter: 1_000, failWith: new Error('x') }),
        ],
      ])('leaves no payload a sweep or head can find when the source %s', async (_label, make) => {
        await expect(store.put(make().stream, options())).rejects.toThrow();
        const { ref } = await store.put(Buffer.from('the only payload'), options());

        const candidates = await store.sweepCandidates(everything());

        expect(candidates.map((candidate) => candidate.ref)).toEqual([ref]);
      });

      it.each([false, true])(
        'rejects with the cause of a source that fails before the store reads it (published: %p)',
        async (published) => {
          const source = new Readable({ read() {} });
          const cause = new Error('upload aborted by the client');
          const put = store.put(source, options({ published }));
          // At once, as an aborted upload or a file that cannot be opened does: the store is still
          // at its own I/O (a directory, a transaction, a marker). Unhandled, the process dies.
          source.destroy(cause);

          const error = await rejectionOf(put);

          expect(error === cause ? error : (error as Error).cause).toBe(cause);
        },
      );

      it('rejects with a TypeError a stream that yields an object after some bytes, and leaves nothing', async () => {
        // An object-mode stream: piped into a byte sink, its object would throw in the pipe's
        // 'data' handler (an uncaught exception) and end the sink cleanly, cut short.
        const source = Readable.from([randomBytes(5_000), { not: 'bytes' }], { objectMode: true });

        await expect(store.put(source, options())).rejects.toThrow(TypeError);

        expect(await store.sweepCandidates(everything())).toEqual([]);
      });

      it('rejects when the source is destroyed before its end, and leaves nothing', async () => {
        let pushed = 0;
        const source = new Readable({
          read() {
            if (pushed >= MIB) return;
            this.push(randomBytes(64 * 1024));
            pushed += 64 * 1024;
            // Destroyed without an error, as an aborted upload is: the store sees a premature close.
            if (pushed >= MIB) setImmediate(() => this.destroy());
          },
        });

        await expect(store.put(source, options())).rejects.toThrow();

        expect(await store.sweepCandidates(everything())).toEqual([]);
      });
    });

    describe('a put with a content type that is not a media type', () => {
      it.each(UNFIT_CONTENT_TYPES)(
        'refuses %s with SequenceOptionsError and writes nothing',
        async (_label, contentType) => {
          const unfit = (published: boolean) => options({ published, contentType } as PutOptions);

          const source = generatedSource(1_000).stream;
          const refusals = [
            await rejectionOf(store.put(Buffer.from('a payload'), unfit(false))),
            await rejectionOf(store.put(Buffer.from('a payload'), unfit(true))),
            await rejectionOf(store.put(source, unfit(true))),
          ];

          // The caller's stream is not left open (a file descriptor, an upload's socket).
          expect(source.destroyed).toBe(true);

          for (const refusal of refusals) {
            expect(refusal).toBeInstanceOf(SequenceOptionsError);
            expect((refusal as SequenceOptionsError).problems).toEqual([
              expect.stringContaining('contentType must be 1-255 printable ASCII characters'),
            ]);
          }
          expect(await store.sweepCandidates(everything())).toEqual([]);
        },
      );

      it('keeps a content type of 255 printable ASCII characters', async () => {
        const contentType = `application/${'x'.repeat(243)}; q="a b"`.slice(0, 255);
        const { ref } = await store.put(Buffer.from('a payload'), options({ contentType }));

        expect(contentType).toHaveLength(255);
        expect((await store.head(ref))?.contentType).toBe(contentType);
      });
    });

    describe('get of a ref the store does not hold', () => {
      it('rejects with ClaimCheckNotFoundError naming the store and the ref', async () => {
        const ref = await foreignRef();

        const error = await rejectionOf(store.get(ref));

        expect(error).toBeInstanceOf(ClaimCheckNotFoundError);
        expect(error).toMatchObject({ store: store.name, ref });
      });

      it('resolves head to undefined', async () => {
        expect(await store.head(await foreignRef())).toBeUndefined();
      });

      it.each(HOSTILE_REFS)('refuses %s without reading anything', async (_label, ref) => {
        await store.put(Buffer.from('bait'), options());

        const error = await rejectionOf(store.get(ref));

        expect(REFUSALS).toContain(refusalOf(error));
        expect(error).toMatchObject({ store: store.name });
      });

      it.each(HOSTILE_REFS)(
        'answers head of %s with undefined or a refusal',
        async (_label, ref) => {
          const outcome = await store
            .head(ref)
            .then(
              (info) => (info === undefined ? 'undefined' : `resolved ${JSON.stringify(info)}`),
              refusalOf,
            );

          expect(['undefined', ...REFUSALS]).toContain(outcome);
        },
      );

      it.each(DERIVED_REFS)(
        'refuses a real ref %s, and get, head, markPublished and the deletes leave it untouched',
        async (_label, derive) => {
          const payload = randomBytes(1_000);
          const { ref } = await store.put(payload, options());
          const hostile = derive(ref);

          expect(REFUSALS).toContain(refusalOf(await rejectionOf(store.get(hostile))));
          const head = await store.head(hostile).catch(refusalOf);
          const marked = await store.markPublished(hostile).catch(refusalOf);
          const deleted = await store.delete(hostile).catch(refusalOf);
          const swept = await deleteIfUnpublished(store, hostile).catch(refusalOf);

          expect(['undefined', ...REFUSALS]).toContain(head === undefined ? 'undefined' : head);
          expect([false, ...REFUSALS]).toContain(marked);
          expect([false, ...REFUSALS]).toContain(deleted);
          expect([false, ...REFUSALS]).toContain(swept);
          expect(await read(ref)).toEqual(digestOfBuffer(payload));
          expect(await store.head(ref)).toMatchObject({ published: false });
        },
      );
    });

    describe('head', () => {
      it('describes a payload as put', async () => {
        const payload = randomBytes(2_345);
        const metadata = { study: '1.2.840.113619', 'x-tenant': 'acmé ✓' };
        const { ref } = await store.put(payload, {
          now: t0,
          expiresAt: t0 + 45 * MINUTE,
          published: true,
          contentType: 'application/dicom; charset=binary',
          metadata,
        });

        expect(await store.head(ref)).toEqual({
          ref,
          bytes: payload.length,
          createdAt: t0,
          expiresAt: t0 + 45 * MINUTE,
          published: true,
          contentType: 'application/dicom; charset=binary',
          metadata,
        });
      });

      it('reports no content type and no metadata when none were given', async () => {
        const { ref } = await store.put(generatedSource(10).stream, options());

        const info = await store.head(ref);

        expect(info).toMatchObject({ ref, bytes: 10, createdAt: t0, published: false });
        expect(info?.contentType).toBeUndefined();
        expect(info?.metadata ?? {}).toEqual({});
      });
    });

    describe('delete', () => {
      it('is idempotent: true when it removed the payload, then false', async () => {
        const { ref } = await store.put(Buffer.from('gone soon'), options());

        expect(await store.delete(ref)).toBe(true);
        expect(await store.delete(ref)).toBe(false);
      });

      it('makes get reject with ClaimCheckNotFoundError and head resolve undefined', async () => {
        const { ref } = await store.put(randomBytes(100_000), options());
        await store.delete(ref);

        await expect(store.get(ref)).rejects.toBeInstanceOf(ClaimCheckNotFoundError);
        expect(await store.head(ref)).toBeUndefined();
      });

      it('answers false for a ref the store never held', async () => {
        expect(await store.delete(await foreignRef())).toBe(false);
      });

      it('removes only the payload it names', async () => {
        const kept = randomBytes(5_000);
        const doomed = await store.put(randomBytes(5_000), options());
        const { ref } = await store.put(kept, options());

        await store.delete(doomed.ref);

        expect(await read(ref)).toEqual(digestOfBuffer(kept));
      });
    });

    describe('markPublished', () => {
      it('flips published and changes nothing else', async () => {
        const { ref } = await store.put(Buffer.from('ticket soon'), {
          ...options(),
          contentType: 'text/plain',
          metadata: { a: '1' },
        });
        const before = await store.head(ref);

        expect(await store.markPublished(ref)).toBe(true);
        expect(await store.head(ref)).toEqual({ ...before, published: true });
        expect(await read(ref)).toEqual(digestOfBuffer(Buffer.from('ticket soon')));
      });

      it('answers true again for a payload already published', async () => {
        const { ref } = await store.put(Buffer.from('x'), options({ published: true }));

        expect(await store.markPublished(ref)).toBe(true);
      });

      it('answers false when the payload is gone or was never there', async () => {
        const { ref } = await store.put(Buffer.from('x'), options());
        await store.delete(ref);

        expect(await store.markPublished(ref)).toBe(false);
        expect(await store.markPublished(await foreignRef())).toBe(false);
      });
    });

    describe('deleteUnpublished (or its fallback, deleteIfUnpublished)', () => {
      it('deletes a payload that is still unpublished: true, then false', async () => {
        const { ref } = await store.put(randomBytes(10_000), options());

        expect(await deleteIfUnpublished(store, ref)).toBe(true);
        expect(await deleteIfUnpublished(store, ref)).toBe(false);
        await expect(store.get(ref)).rejects.toBeInstanceOf(ClaimCheckNotFoundError);
        expect(await store.head(ref)).toBeUndefined();
        expect(await store.sweepCandidates(everything())).toEqual([]);
      });

      it('keeps a payload put published, and one marked published since', async () => {
        const payload = randomBytes(5_000);
        const put = await store.put(payload, options({ published: true }));
        const marked = await store.put(payload, options());
        await store.markPublished(marked.ref);

        for (const { ref } of [put, marked]) {
          expect(await deleteIfUnpublished(store, ref)).toBe(false);
          expect(await read(ref)).toEqual(digestOfBuffer(payload));
          expect(await store.head(ref)).toMatchObject({ published: true });
        }
      });

      it('answers false for a ref the store never held', async () => {
        expect(await deleteIfUnpublished(store, await foreignRef())).toBe(false);
      });

      it('makes a later markPublished answer false', async () => {
        const { ref } = await store.put(Buffer.from('orphan'), options());
        await deleteIfUnpublished(store, ref);

        expect(await store.markPublished(ref)).toBe(false);
        expect(await store.head(ref)).toBeUndefined();
      });

      (harness.atomicDeleteUnpublished === false ? it.skip : it)(
        'never takes a payload whose markPublished answered true, and answers true for exactly ' +
          'one of the two, however they interleave (passes at once without deleteUnpublished)',
        async () => {
          // Optional: a store without it has nothing to race (its fallback is not atomic).
          const deleteUnpublished = store.deleteUnpublished?.bind(store);
          if (!deleteUnpublished) return;
          const payload = randomBytes(3_000);
          const refs = await Promise.all(
            Array.from({ length: 64 }, async () => (await store.put(payload, options())).ref),
          );

          // One started first, the other after 0 to 7 turns of the event loop: every step of
          // either may meet every step of the other.
          const outcomes = await Promise.all(
            refs.map(async (ref, index) => {
              const turns = (index >> 1) % 8;
              const later = async <T>(call: () => Promise<T>): Promise<T> => {
                for (let turn = 0; turn < turns; turn++) await new Promise(setImmediate);
                return call();
              };
              const [marked, deleted] =
                index % 2 === 0
                  ? await Promise.all([
                      store.markPublished(ref),
                      later(() => deleteUnpublished(ref)),
                    ])
                  : await Promise.all([
                      later(() => store.markPublished(ref)),
                      deleteUnpublished(ref),
                    ]);
              return { ref, marked, deleted };
            }),
          );

          for (const { ref, marked, deleted } of outcomes) {
            const kept = (await store.head(ref)) !== undefined;
            // Kept: published, and its markPublished said so (a false one fails a publish that
            // succeeded). Gone: the delete said so.
            expect({ ref, marked, deleted }).toEqual({ ref, marked: kept, deleted: !kept });
            if (kept) {
              expect(await read(ref)).toEqual(digestOfBuffer(payload));
              expect(await store.head(ref)).toMatchObject({ published: true });
            } else {
              await expect(store.get(ref)).rejects.toBeInstanceOf(ClaimCheckNotFoundError);
            }
          }
          // None left unpublished: nothing for a sweep before their expiry.
          expect(
            await store.sweepCandidates({ ...everything(), now: t0 + 30 * MINUTE - 1 }),
          ).toEqual([]);
        },
      );
    });

    describe('sweepCandidates', () => {
      const sweep = (query: Partial<SweepQuery>): Promise<SweepCandidate[]> =>
        store.sweepCandidates({ now: t0, unpublishedBefore: t0 - 1, limit: 100, ...query });

      it('lists a payload as expired from its expiresAt on, not before', async () => {
        const { ref } = await store.put(Buffer.from('e'), options({ published: true }));
        const expiresAt = t0 + 30 * MINUTE;

        expect(await sweep({ now: expiresAt - 1 })).toEqual([]);
        expect(await sweep({ now: expiresAt })).toEqual([{ ref, reason: 'expired' }]);
      });

      it('lists an unpublished payload as orphaned once created at or before the grace instant', async () => {
        const { ref } = await store.put(Buffer.from('o'), options({ now: t0 + 10 }));

        expect(await sweep({ unpublishedBefore: t0 + 9 })).toEqual([]);
        expect(await sweep({ unpublishedBefore: t0 + 10 })).toEqual([{ ref, reason: 'orphaned' }]);
      });

      it('never lists a payload that is published and not expired', async () => {
        await store.put(Buffer.from('n'), options({ published: true, now: t0 - MINUTE }));

        expect(await sweep({ unpublishedBefore: t0, now: t0 + MINUTE })).toEqual([]);
      });

      it('stops listing an orphan once it is published', async () => {
        const { ref } = await store.put(Buffer.from('late ticket'), options());
        await store.markPublished(ref);

        expect(await sweep({ unpublishedBefore: t0 + MINUTE })).toEqual([]);
      });

      it('lists a payload both expired and orphaned once', async () => {
        const { ref } = await store.put(Buffer.from('both'), options());

        const candidates = await sweep({ now: t0 + 60 * MINUTE, unpublishedBefore: t0 });

        expect(candidates).toHaveLength(1);
        expect(candidates[0].ref).toBe(ref);
        expect(['expired', 'orphaned']).toContain(candidates[0].reason);
      });

      it('tells expired, orphaned and neither apart in one sweep', async () => {
        const expired = await store.put(Buffer.from('1'), options({ published: true }));
        const orphaned = await store.put(
          Buffer.from('2'),
          options({ expiresAt: t0 + 90 * MINUTE, now: t0 - MINUTE }),
        );
        await store.put(
          Buffer.from('3'),
          options({ published: true, expiresAt: t0 + 90 * MINUTE }),
        );
        await store.put(Buffer.from('4'), options({ expiresAt: t0 + 90 * MINUTE, now: t0 + 1 }));
        const deleted = await store.put(Buffer.from('5'), options({ published: true }));
        await store.delete(deleted.ref);

        const candidates = await sweep({ now: t0 + 30 * MINUTE, unpublishedBefore: t0 });

        expect(candidates).toHaveLength(2);
        expect(candidates).toEqual(
          expect.arrayContaining([
            { ref: expired.ref, reason: 'expired' },
            { ref: orphaned.ref, reason: 'orphaned' },
          ]),
        );
      });

      it('returns at most limit candidates, and repeated sweeps reach them all', async () => {
        const refs = new Set<string>();
        for (let index = 0; index < 7; index += 1) {
          refs.add((await store.put(Buffer.from(`p${index}`), options({ now: t0 + index }))).ref);
        }
        const swept = new Set<string>();

        for (let round = 0; round < 7 && swept.size < refs.size; round += 1) {
          const candidates = await sweep({ unpublishedBefore: t0 + MINUTE, limit: 3 });
          expect(candidates.length).toBeGreaterThan(0);
          expect(candidates.length).toBeLessThanOrEqual(3);
          for (const candidate of candidates) {
            expect(swept.has(candidate.ref)).toBe(false);
            swept.add(candidate.ref);
            await store.delete(candidate.ref);
          }
        }

        expect(swept).toEqual(refs);
        expect(await sweep({ unpublishedBefore: t0 + MINUTE, limit: 3 })).toEqual([]);
      });
    });
  });
}
