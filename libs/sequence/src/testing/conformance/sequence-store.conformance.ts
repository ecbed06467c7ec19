import { randomBytes, randomUUID } from 'node:crypto';
import type { Readable } from 'node:stream';
import { crc32, sha256Hex } from '../../core/checksum';
import { FRAGMENT_OVERHEAD_BYTES, SEQUENCE_OVERHEAD_BYTES } from '../../core/completeness';
import type { HeaderMap } from '../../core/headers';
import type {
  AcceptContext,
  AcceptResult,
  FragmentRecord,
  SequenceLimits,
  SequenceRef,
  SequenceStore,
} from '../../ports/sequence-store.port';
import {
  describeOpenSequenceCases,
  type OpenSequenceCaseContext,
} from './sequence-store/open-sequences.cases';
import { describeStatusCases } from './sequence-store/status.cases';

export interface SequenceStoreHarness {
  /** A fresh, empty store (for a server-backed store: under a key prefix of its own). */
  create(): Promise<SequenceStore>;
  /** Closes it and cleans up; `store.close()` when absent. */
  close?(store: SequenceStore): Promise<void>;
  /**
   * Whether the adapter implements the optional `listOpen` and `inspect` (the operator console's
   * reads): their cases run only then. @default true
   */
  readonly openSequences?: boolean;
  /** Whether the adapter implements the optional `status`: its cases run only then. @default true */
  readonly status?: boolean;
}

interface Fixture {
  readonly ref: SequenceRef;
  readonly payload: Buffer;
  readonly sha256: string;
  readonly fragments: FragmentRecord[];
}

interface FixtureOptions {
  /** Only the last fragment carries the size. @default false */
  readonly streamed?: boolean;
  /** Every fragment carries `bytes`. @default true */
  readonly declareBytes?: boolean;
  /** Every fragment carries `sha256`, not only the last. @default false */
  readonly shaOnEvery?: boolean;
  readonly contentType?: string;
  readonly contentEncoding?: string;
  readonly userHeaders?: HeaderMap;
}

const GENEROUS_LIMITS: SequenceLimits = {
  maxSequenceBytes: 64 * 1024 * 1024,
  maxFragments: 10_000,
  maxBufferedBytes: 256 * 1024 * 1024,
  maxOpenSequences: 10_000,
};

/** The fragments of a payload cut into `bodies`, with headers as the splitter sets them. */
export function sequenceFixture(
  scope: string,
  bodies: ReadonlyArray<Buffer | string>,
  options: FixtureOptions = {},
): Fixture {
  const buffers = bodies.map((body) => (typeof body === 'string' ? Buffer.from(body) : body));
  const payload = Buffer.concat(buffers);
  const sha256 = sha256Hex(payload);
  const size = buffers.length;
  const ref = { scope, sequenceId: `seq-${randomUUID()}` };
  const fragments = buffers.map((body, index): FragmentRecord => {
    const last = index === size - 1;
    return {
      ...ref,
      position: index + 1,
      size: options.streamed && !last ? undefined : size,
      last,
      crc32: crc32(body),
      sha256: last || options.shaOnEvery ? sha256 : undefined,
      bytes: options.declareBytes === false ? undefined : payload.length,
      contentType: options.contentType,
      contentEncoding: options.contentEncoding,
      userHeaders: options.userHeaders ?? {},
      body,
    };
  });
  return { ref, payload, sha256, fragments };
}

/**
 * Budget bytes one sequence holds for stored bodies of these lengths, kept with no user headers
 * (`{}`, 2 bytes): see core/completeness `storedCharge`.
 */
export function storedChargeOf(...bodyLengths: number[]): number {
  const bodies = bodyLengths.reduce((sum, length) => sum + length, 0);
  return SEQUENCE_OVERHEAD_BYTES + 2 + bodyLengths.length * FRAGMENT_OVERHEAD_BYTES + bodies;
}

/** A fragment like `fragment` with another body (and the matching crc32). */
function withBody(fragment: FragmentRecord, body: string): FragmentRecord {
  const buffer = Buffer.from(body);
  return { ...fragment, body: buffer, crc32: crc32(buffer) };
}

export async function readAll(stream: Readable): Promise<Buffer[]> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk as Buffer);
  return chunks;
}

/**
 * The behaviour every {@link SequenceStore} adapter must show. Time is passed in (`now`), so
 * nothing here sleeps; each case uses a scope of its own and a fresh store.
 */
/** The consumer id the suite's accepts use unless a test says otherwise. */
const CONSUMER = 'consumer-a';

export function describeSequenceStoreConformance(
  adapterName: string,
  harness: SequenceStoreHarness,
): void {
  describe(`SequenceStore conformance: ${adapterName}`, () => {
    let store: SequenceStore;
    let scope: string;
    /** A base time near the real clock, for stores that also keep server-side TTLs. */
    let t0: number;

    beforeEach(async () => {
      store = await harness.create();
      scope = `conf.${randomUUID()}`;
      t0 = Date.now();
    });

    afterEach(async () => {
      await (harness.close ? harness.close(store) : store.close());
    });

    type ContextOverrides = Partial<Omit<AcceptContext, 'limits'>> & {
      limits?: Partial<SequenceLimits>;
    };

    function context(at: number, overrides: ContextOverrides = {}): AcceptContext {
      return {
        now: at,
        consumerId: CONSUMER,
        leaseMs: 30_000,
        expiry: { ms: 60_000, strategy: 'fixed' },
        retentionMs: 3_600_000,
        ...overrides,
        limits: { ...GENEROUS_LIMITS, ...overrides.limits },
      };
    }

    const accept = (fragment: FragmentRecord, at = t0, overrides?: ContextOverrides) =>
      store.accept(fragment, context(at, overrides));

    async function acceptAll(
      fragments: FragmentRecord[],
      at = t0,
      overrides?: ContextOverrides,
    ): Promise<AcceptResult[]> {
      const results: AcceptResult[] = [];
      for (const fragment of fragments) results.push(await accept(fragment, at, overrides));
      return results;
    }

    async function payloadOf(ref: SequenceRef): Promise<string> {
      return Buffer.concat(await readAll(store.read(ref))).toString();
    }

    const finishCompleted = (ref: SequenceRef, at = t0) =>
      store.finish(ref, 'completed', { now: at, retentionMs: 3_600_000, consumerId: CONSUMER });

    describe('accept', () => {
      it('opens a sequence with its first fragment and stores the next ones', async () => {
        const { fragments } = sequenceFixture(scope, ['a', 'b', 'c']);

        expect(await accept(fragments[0])).toEqual({ status: 'stored', opened: true });
        expect(await accept(fragments[1])).toEqual({ status: 'stored', opened: false });
      });

      it('answers duplicate for a fragment stored again, and changes nothing', async () => {
        const { fragments } = sequenceFixture(scope, ['aa', 'bb', 'cc']);
        await accept(fragments[0]);
        const before = await store.stats(t0);

        expect(await accept(fragments[0], t0 + 10)).toEqual({ status: 'duplicate' });
        expect(await store.stats(t0)).toEqual(before);
      });

      it.each([
        ['in order', [0, 1, 2, 3, 4]],
        ['in reverse', [4, 3, 2, 1, 0]],
        ['shuffled', [2, 4, 0, 3, 1]],
        ['shuffled, with duplicates', [3, 3, 0, 4, 0, 1, 4, 2, 1, 2]],
      ])('completes exactly once, on the last missing fragment, %s', async (_name, order) => {
        const { fragments } = sequenceFixture(scope, ['a', 'b', 'c', 'd', 'e']);
        const results = await acceptAll(order.map((index) => fragments[index]));

        const statuses = results.map((result) => result.status);
        expect(statuses.filter((status) => status === 'complete')).toHaveLength(1);
        const firstSeen = order.map((index, at) => order.indexOf(index) === at);
        const lastNew = firstSeen.lastIndexOf(true);
        expect(statuses[lastNew]).toBe('complete');
        expect(statuses.slice(lastNew + 1).every((status) => status === 'in-progress')).toBe(true);
      });

      it('completes a one-fragment sequence on its first fragment, opened', async () => {
        const { fragments } = sequenceFixture(scope, ['only']);

        expect(await accept(fragments[0])).toMatchObject({ status: 'complete', opened: true });
      });

      it('completes a streamed sequence once the last fragment brings the size', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['s1', 's2', 's3'], {
          streamed: true,
          declareBytes: false,
        });
        const results = await acceptAll([fragments[1], fragments[0], fragments[2]]);

        expect(results.map((result) => result.status)).toEqual(['stored', 'stored', 'complete']);
        expect(await payloadOf(ref)).toBe('s1s2s3');
      });

      it('describes the complete sequence', async () => {
        const userHeaders = { 'x-tenant': 'acme', 'x-priority': 2, 'x-urgent': true };
        const { fragments, payload, sha256 } = sequenceFixture(scope, ['first', 'second'], {
          contentType: 'application/dicom',
          contentEncoding: 'identity',
          userHeaders,
        });
        await accept(fragments[1], t0 + 5);

        // `stored` is optional (a store that leaves it out costs its sequences a read back).
        const { stored, ...result } = (await accept(fragments[0], t0 + 20)) as AcceptResult & {
          stored?: boolean;
        };
        expect([true, undefined]).toContain(stored);
        expect(result).toEqual({
          status: 'complete',
          opened: false,
          sequence: {
            scope,
            sequenceId: fragments[0].sequenceId,
            fragments: 2,
            bytes: payload.length,
            sha256,
            declaredBytes: payload.length,
            contentType: 'application/dicom',
            contentEncoding: 'identity',
            userHeaders,
            firstFragmentAt: t0 + 5,
            lastFragmentAt: t0 + 20,
          },
        });
      });

      it('gives complete to exactly one of concurrent callers storing the last fragments', async () => {
        const { fragments } = sequenceFixture(scope, ['1', '2', '3', '4', '5', '6']);
        await acceptAll(fragments.slice(0, 2));

        const results = await Promise.all(
          fragments
            .slice(2)
            .map((fragment, index) => accept(fragment, t0, { consumerId: `consumer-${index}` })),
        );
        expect(results.filter((result) => result.status === 'complete')).toHaveLength(1);
        expect(results.filter((result) => result.status === 'stored')).toHaveLength(3);
      });

      it('gives complete to exactly one caller when every fragment arrives twice at once', async () => {
        const { fragments } = sequenceFixture(scope, ['1', '2', '3', '4']);

        const results = await Promise.all(
          [...fragments, ...fragments].map((fragment, index) =>
            accept(fragment, t0, { consumerId: `consumer-${index}` }),
          ),
        );
        const statuses = results.map((result) => result.status);
        expect(statuses.filter((status) => status === 'complete')).toHaveLength(1);
        expect(statuses.filter((status) => status === 'stored')).toHaveLength(3);
        expect(
          statuses.filter((status) => status === 'stored' || status === 'complete'),
        ).toHaveLength(4);
      });
    });

    describe('read', () => {
      it('streams the bodies in position order, byte-exact, never joining two', async () => {
        const bodies = [randomBytes(70_000), randomBytes(1), randomBytes(20_000), randomBytes(5)];
        const { fragments, ref, payload } = sequenceFixture(scope, bodies);
        await acceptAll([fragments[2], fragments[0], fragments[3], fragments[1]]);

        const chunks = await readAll(store.read(ref));
        expect(Buffer.concat(chunks).equals(payload)).toBe(true);
        const chunkEnds = new Set<number>();
        let offset = 0;
        for (const chunk of chunks) chunkEnds.add((offset += chunk.length));
        let fragmentEnd = 0;
        for (const body of bodies) {
          fragmentEnd += body.length;
          expect({ fragmentEnd, isChunkBoundary: chunkEnds.has(fragmentEnd) }).toEqual({
            fragmentEnd,
            isChunkBoundary: true,
          });
        }
      });

      it('hands out chunks of their own: a reader that changes them changes no later read', async () => {
        // A handler may decode in place, then fail: its retry reads the sequence again.
        const { fragments, ref, payload } = sequenceFixture(scope, ['abc', 'def']);
        await acceptAll(fragments);
        for (const chunk of await readAll(store.read(ref))) chunk.fill(0x58);

        expect(Buffer.concat(await readAll(store.read(ref))).equals(payload)).toBe(true);
      });
    });

    describe('contradictions', () => {
      /** Fragment 1 stored (and 3, the last, for duplicate-last); each case sends a bad one. */
      const cases: Array<
        [code: string, what: string, bad: (f: FragmentRecord[]) => FragmentRecord]
      > = [
        ['conflicting-duplicate', 'position 1 again with another body', (f) => withBody(f[0], 'X')],
        ['size-changed', 'another size', (f) => ({ ...f[1], size: 4 })],
        ['position-out-of-range', 'a position beyond the size', (f) => ({ ...f[1], position: 4 })],
        [
          'duplicate-last',
          'a second last fragment at another position',
          (f) => ({ ...f[1], last: true, size: 2 }),
        ],
        [
          'malformed-header',
          'the last position without the last flag (it would complete the sequence without its sha256)',
          (f) => ({ ...f[2], last: false, sha256: undefined }),
        ],
        ['declaration-changed', 'other declared bytes', (f) => ({ ...f[1], bytes: 999 })],
        ['declaration-changed', 'another sha256', (f) => ({ ...f[1], sha256: 'f'.repeat(64) })],
        [
          'declaration-changed',
          'a body that takes the stored bytes past the declared bytes',
          (f) => withBody(f[1], 'bbbbbbb'),
        ],
        ['declaration-changed', 'another content-type', (f) => ({ ...f[1], contentType: 'a/b' })],
        [
          'declaration-changed',
          'another content-encoding',
          (f) => ({ ...f[1], contentEncoding: 'br' }),
        ],
        [
          'declaration-changed',
          'a stored position again with another content-type',
          (f) => ({ ...f[0], contentType: 'a/b' }),
        ],
      ];

      it.each(cases)(
        'rejects as %s %s, changes nothing, and the sequence still completes',
        async (code, _what, bad) => {
          const { fragments, ref } = sequenceFixture(scope, ['aaa', 'bbb', 'ccc'], {
            shaOnEvery: true,
            contentType: 'application/json',
            contentEncoding: 'gzip',
          });
          await accept(fragments[0]);
          if (code === 'duplicate-last') await accept(fragments[2]);
          const before = await store.stats(t0);

          expect(await accept(bad(fragments), t0 + 1)).toEqual({
            status: 'rejected',
            code,
            detail: expect.any(String),
            sequenceRejected: false,
          });
          expect(await store.stats(t0 + 1)).toEqual(before);

          const rest = code === 'duplicate-last' ? [fragments[1]] : fragments.slice(1);
          const results = await acceptAll(rest, t0 + 2);
          expect(results.at(-1)?.status).toBe('complete');
          expect(await payloadOf(ref)).toBe('aaabbbccc');
        },
      );

      it('rejects as malformed-header a size that makes a position stored without the last flag the last one', async () => {
        // A producer that streamed position 3 as an ordinary fragment (no size, no last flag,
        // no sha256), then declared size 3 on the others: 1..3 would complete unverifiable.
        const { fragments } = sequenceFixture(scope, ['aaa', 'bbb', 'ccc'], { streamed: true });
        const third = { ...fragments[2], last: false, size: undefined, sha256: undefined };
        const declaring = fragments.slice(0, 2).map((fragment) => ({ ...fragment, size: 3 }));
        expect((await accept(third)).status).toBe('stored');
        const before = await store.stats(t0);

        for (const fragment of declaring) {
          expect(await accept(fragment, t0 + 1)).toEqual({
            status: 'rejected',
            code: 'malformed-header',
            detail:
              'size 3 makes position 3 the last one, but it was stored without x-sequence-last',
            sequenceRejected: false,
          });
        }
        expect(await store.stats(t0 + 1)).toEqual(before);
      });

      it('takes the content-type and content-encoding of whichever fragment carries them: a fragment carrying none agrees with any', async () => {
        const { fragments } = sequenceFixture(scope, ['aaa', 'bbb', 'ccc', 'ddd']);
        const carrying = [
          fragments[0],
          { ...fragments[1], contentType: 'application/json' },
          { ...fragments[2], contentEncoding: 'gzip' },
        ];
        await acceptAll(carrying);
        expect(await accept({ ...fragments[3], contentType: 'text/plain' }, t0 + 1)).toEqual({
          status: 'rejected',
          code: 'declaration-changed',
          detail: expect.any(String),
          sequenceRejected: false,
        });
        expect(await accept({ ...fragments[3], contentEncoding: 'br' }, t0 + 1)).toMatchObject({
          status: 'rejected',
          code: 'declaration-changed',
        });

        expect(await accept(fragments[3], t0 + 2)).toMatchObject({
          status: 'complete',
          sequence: { contentType: 'application/json', contentEncoding: 'gzip' },
        });
      });

      it('rejects a first fragment whose body alone passes the bytes it declares, opening nothing', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['aaa', 'bbb']);

        expect(await accept(withBody(fragments[0], 'aaaaaaa'))).toEqual({
          status: 'rejected',
          code: 'declaration-changed',
          detail: expect.any(String),
          sequenceRejected: false,
        });
        expect(await store.stats(t0)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });

        const results = await acceptAll(fragments, t0 + 1);
        expect(results.map((result) => result.status)).toEqual(['stored', 'complete']);
        expect(await payloadOf(ref)).toBe('aaabbb');
      });

      it('answers duplicate for a stored fragment whose body, counted again, would pass the declared bytes', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['a', 'b'.repeat(8), 'c']);
        await acceptAll([fragments[1], fragments[0]]);
        const before = await store.stats(t0);

        expect(await accept(fragments[1], t0 + 1)).toEqual({ status: 'duplicate' });
        expect(await store.stats(t0 + 1)).toEqual(before);
        expect(await accept(fragments[2], t0 + 2)).toMatchObject({ status: 'complete' });
        expect(await payloadOf(ref)).toBe(`a${'b'.repeat(8)}c`);
      });

      it('rejects a size below a position already stored (streamed)', async () => {
        const { fragments } = sequenceFixture(scope, ['a', 'b', 'c', 'd', 'e'], { streamed: true });
        await accept(fragments[3]);

        expect(await accept({ ...fragments[4], position: 2, size: 2 })).toMatchObject({
          status: 'rejected',
          code: 'position-out-of-range',
          sequenceRejected: false,
        });
      });
    });

    describe('per-sequence limits', () => {
      it('rejects each fragment of a sequence that declares more than maxSequenceBytes, keeping nothing', async () => {
        const { fragments } = sequenceFixture(scope, ['x'.repeat(60), 'y'.repeat(60)]);
        const limits = { maxSequenceBytes: 100 };

        for (const fragment of fragments) {
          expect(await accept(fragment, t0, { limits })).toEqual({
            status: 'rejected',
            code: 'sequence-too-large',
            detail: expect.any(String),
            sequenceRejected: false,
          });
        }
        expect(await store.stats(t0 + 1)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
        // No marker was kept for it: under generous limits the same id opens a sequence.
        expect(await accept(fragments[0], t0 + 1)).toEqual({ status: 'stored', opened: true });
      });

      it('rejects and drops a sequence whose fragments pass maxSequenceBytes', async () => {
        const { fragments } = sequenceFixture(scope, ['x'.repeat(60), 'y'.repeat(60), 'z'], {
          declareBytes: false,
        });
        const limits = { maxSequenceBytes: 100 };
        expect(await accept(fragments[0], t0, { limits })).toMatchObject({ status: 'stored' });

        expect(await accept(fragments[1], t0, { limits })).toMatchObject({
          status: 'rejected',
          code: 'sequence-too-large',
          sequenceRejected: true,
        });
        expect(await store.stats(t0)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
        for (const late of [fragments[2], fragments[0]]) {
          expect(await accept(late, t0 + 1, { limits })).toMatchObject({
            status: 'finished',
            outcome: 'rejected',
          });
        }
      });

      it('rejects each fragment of a sequence that declares more than maxFragments, keeping nothing', async () => {
        const { fragments } = sequenceFixture(scope, ['a', 'b', 'c', 'd']);
        const limits = { maxFragments: 3 };

        for (const fragment of fragments.slice(0, 2)) {
          expect(await accept(fragment, t0, { limits })).toMatchObject({
            status: 'rejected',
            code: 'too-many-fragments',
            sequenceRejected: false,
          });
        }
        expect(await store.stats(t0)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
      });

      it('marks a sequence rejected once it stored something before passing a limit', async () => {
        const { fragments } = sequenceFixture(scope, ['a', 'b', 'c', 'd', 'e'], { streamed: true });
        const limits = { maxFragments: 3 };
        await acceptAll(fragments.slice(0, 2), t0, { limits });

        expect(await accept(fragments[4], t0, { limits })).toMatchObject({
          status: 'rejected',
          code: 'too-many-fragments',
          sequenceRejected: true,
        });
        expect(await accept(fragments[0], t0, { limits })).toMatchObject({
          status: 'finished',
          outcome: 'rejected',
        });
      });

      it('rejects a streamed sequence once a position passes maxFragments', async () => {
        const { fragments } = sequenceFixture(scope, ['a', 'b', 'c', 'd', 'e'], { streamed: true });
        const limits = { maxFragments: 3 };
        await acceptAll(fragments.slice(0, 3), t0, { limits });

        expect(await accept(fragments[3], t0, { limits })).toMatchObject({
          status: 'rejected',
          code: 'too-many-fragments',
          sequenceRejected: true,
        });
        expect(await store.stats(t0)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
      });
    });

    describe('store-wide limits', () => {
      it('answers backpressure for a new sequence at maxOpenSequences, storing nothing', async () => {
        const limits = { maxOpenSequences: 2 };
        const [a, b, c] = [1, 2, 3].map(() => sequenceFixture(scope, ['1', '2']));
        await accept(a.fragments[0], t0, { limits });
        await accept(b.fragments[0], t0, { limits });

        expect(await accept(c.fragments[0], t0, { limits })).toEqual({
          status: 'backpressure',
          limit: 'maxOpenSequences',
        });
        expect(await store.stats(t0)).toMatchObject({
          openSequences: 2,
          bufferedBytes: 2 * storedChargeOf(1),
        });
        expect(await accept(a.fragments[1], t0, { limits })).toMatchObject({ status: 'complete' });

        await finishCompleted(a.ref);
        expect(await accept(c.fragments[0], t0, { limits })).toEqual({
          status: 'stored',
          opened: true,
        });
      });

      it('answers backpressure at maxBufferedBytes, yet a sequence that reserved its bytes completes', async () => {
        const reserved = sequenceFixture(scope, ['a'.repeat(20), 'b'.repeat(20), 'c'.repeat(40)]);
        const other = sequenceFixture(scope, ['x'.repeat(30), 'y'], { declareBytes: false });
        // The first reserves its 3 fragments and 80 bytes when it opens; 100 bytes are left.
        const limits = { maxBufferedBytes: storedChargeOf(20, 20, 40) + 100 };
        expect(await accept(reserved.fragments[0], t0, { limits })).toMatchObject({
          status: 'stored',
        });
        expect(await store.stats(t0)).toMatchObject({
          openSequences: 1,
          bufferedBytes: storedChargeOf(20),
          reservedBytes: 2 * FRAGMENT_OVERHEAD_BYTES + 60,
        });

        expect(await accept(other.fragments[0], t0, { limits })).toEqual({
          status: 'backpressure',
          limit: 'maxBufferedBytes',
        });
        const rest = await acceptAll(reserved.fragments.slice(1), t0, { limits });
        expect(rest.map((result) => result.status)).toEqual(['stored', 'complete']);
        expect(await store.stats(t0)).toMatchObject({
          bufferedBytes: storedChargeOf(20, 20, 40),
          reservedBytes: 0,
        });
        expect(await accept(other.fragments[0], t0, { limits })).toMatchObject({
          status: 'backpressure',
        });

        await finishCompleted(reserved.ref);
        expect(await accept(other.fragments[0], t0, { limits })).toEqual({
          status: 'stored',
          opened: true,
        });
      });

      it("keeps one channel's reservations from starving another: maxChannelBufferedBytes", async () => {
        const squatScope = `${scope}.squatter`;
        const limits = { maxBufferedBytes: 40_000, maxChannelBufferedBytes: 20_000 };
        // A one-byte first fragment that declares 15,000 bytes reserves them all.
        const declared = Buffer.alloc(15_000, 's');
        const squatters = [1, 2].map(() =>
          sequenceFixture(squatScope, [declared.subarray(0, 1), declared.subarray(1)]),
        );
        expect(await accept(squatters[0].fragments[0], t0, { limits })).toMatchObject({
          status: 'stored',
        });
        expect(await accept(squatters[1].fragments[0], t0, { limits })).toEqual({
          status: 'backpressure',
          limit: 'maxChannelBufferedBytes',
        });

        const honest = sequenceFixture(scope, ['h'.repeat(7_000), 'i'.repeat(7_000)]);
        const results = await acceptAll(honest.fragments, t0, { limits });
        expect(results.map((result) => result.status)).toEqual(['stored', 'complete']);
      });

      it('rejects a first fragment whose sequence could never fit the budget, keeping nothing', async () => {
        const { fragments } = sequenceFixture(scope, Array<string>(10).fill('z'.repeat(100)));
        const limits = { maxBufferedBytes: 2_000 };

        expect(await accept(fragments[0], t0, { limits })).toEqual({
          status: 'rejected',
          code: 'sequence-too-large',
          detail: expect.stringMatching(/maxBufferedBytes \(2000\)/),
          sequenceRejected: false,
        });
        expect(await store.stats(t0)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
        expect(await accept(fragments[0], t0)).toEqual({ status: 'stored', opened: true });
      });

      it('rejects a sequence that could never fit even at maxOpenSequences, not back-pressured', async () => {
        const limits = { maxBufferedBytes: 2_000, maxOpenSequences: 1 };
        const open = sequenceFixture(scope, ['a', 'b']);
        expect(await accept(open.fragments[0], t0, { limits })).toEqual({
          status: 'stored',
          opened: true,
        });
        // Another sequence ending would not make room for it: refused now, not requeued until then.
        const { fragments } = sequenceFixture(scope, Array<string>(10).fill('z'.repeat(100)));
        expect(await accept(fragments[0], t0, { limits })).toMatchObject({
          status: 'rejected',
          code: 'sequence-too-large',
          sequenceRejected: false,
        });
      });

      it('rejects and drops an open sequence once it grows past what the budget could ever hold', async () => {
        // Streamed, no declared bytes: 3 × 1,000 bytes need 4,794 budget bytes with their
        // overheads, within maxSequenceBytes but never within a 4,000-byte budget, even alone.
        const { fragments } = sequenceFixture(scope, Array<string>(5).fill('s'.repeat(1_000)), {
          declareBytes: false,
          streamed: true,
        });
        const limits = { maxBufferedBytes: 4_000, maxSequenceBytes: 4_000 };
        expect(await acceptAll(fragments.slice(0, 2), t0, { limits })).toEqual([
          { status: 'stored', opened: true },
          { status: 'stored', opened: false },
        ]);

        expect(await accept(fragments[2], t0, { limits })).toEqual({
          status: 'rejected',
          code: 'sequence-too-large',
          detail: expect.stringMatching(/maxBufferedBytes \(4000\)/),
          sequenceRejected: true,
        });
        expect(await store.stats(t0)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
        expect(await accept(fragments[3], t0 + 1, { limits })).toMatchObject({
          status: 'finished',
          outcome: 'rejected',
          reason: expect.stringMatching(/^sequence-too-large: /),
        });
      });

      it('charges empty fragments: a flood of them meets maxBufferedBytes', async () => {
        const limits = { maxBufferedBytes: 100 * storedChargeOf(0) };
        let stored = 0;
        let result: AcceptResult | undefined;
        for (let i = 0; i < 200; i++) {
          const { fragments } = sequenceFixture(scope, ['', ''], {
            declareBytes: false,
            streamed: true,
          });
          result = await accept(fragments[0], t0, { limits });
          if (result.status !== 'stored') break;
          stored++;
        }
        expect(result).toEqual({ status: 'backpressure', limit: 'maxBufferedBytes' });
        expect(stored).toBe(100);
        expect(await store.stats(t0)).toMatchObject({ bufferedBytes: 100 * storedChargeOf(0) });
      });

      it('charges the headers a sequence keeps', async () => {
        const userHeaders = { 'x-note': 'n'.repeat(500) };
        const { fragments } = sequenceFixture(scope, ['a', 'b'], { userHeaders });
        await accept(fragments[0]);
        const headerBytes = Buffer.byteLength(JSON.stringify(userHeaders));
        expect((await store.stats(t0)).bufferedBytes).toBe(storedChargeOf(1) - 2 + headerBytes);
      });

      it('answers backpressure for the next fragment of an open sequence when the budget is spent', async () => {
        const a = sequenceFixture(scope, ['a'.repeat(50), 'b'.repeat(20)], { declareBytes: false });
        const b = sequenceFixture(scope, ['c'.repeat(40), 'd'], { declareBytes: false });
        // Each reserved its 2 fragments' overhead, not its bytes: 10 bytes are left.
        const stored = storedChargeOf(50) + storedChargeOf(40);
        const limits = { maxBufferedBytes: stored + 2 * FRAGMENT_OVERHEAD_BYTES + 10 };
        await accept(a.fragments[0], t0, { limits });
        await accept(b.fragments[0], t0, { limits });

        expect(await accept(a.fragments[1], t0, { limits })).toEqual({
          status: 'backpressure',
          limit: 'maxBufferedBytes',
        });
        expect(await store.stats(t0)).toMatchObject({
          openSequences: 2,
          bufferedBytes: stored,
          reservedBytes: 2 * FRAGMENT_OVERHEAD_BYTES,
        });
        expect(await accept(b.fragments[1], t0, { limits })).toMatchObject({ status: 'complete' });
      });

      it('answers backpressure for a new sequence that declares more than the budget left', async () => {
        const first = sequenceFixture(scope, ['a'.repeat(10), 'b'.repeat(70)]);
        const tooBig = sequenceFixture(scope, ['c'.repeat(10), 'd'.repeat(20)]);
        const fits = sequenceFixture(scope, ['e'.repeat(10), 'f'.repeat(10)]);
        // first reserves its whole 80 bytes; then room for a 25-byte two-fragment one.
        const limits = { maxBufferedBytes: storedChargeOf(10, 70) + storedChargeOf(0, 0) + 25 };
        await accept(first.fragments[0], t0, { limits });

        expect(await accept(tooBig.fragments[0], t0, { limits })).toEqual({
          status: 'backpressure',
          limit: 'maxBufferedBytes',
        });
        expect(await accept(fits.fragments[0], t0, { limits })).toEqual({
          status: 'stored',
          opened: true,
        });
      });
    });

    describe('completion lease', () => {
      async function completeBy(consumerId: string, leaseMs: number) {
        const fixture = sequenceFixture(scope, ['p', 'q']);
        await accept(fixture.fragments[0], t0, { consumerId, leaseMs });
        const result = await accept(fixture.fragments[1], t0, { consumerId, leaseMs });
        expect(result).toMatchObject({ status: 'complete' });
        return fixture;
      }

      it('answers in-progress while the lease is live, and complete again once it lapsed', async () => {
        const { fragments, ref } = await completeBy('consumer-a', 1_000);
        const asB = { consumerId: 'consumer-b', leaseMs: 1_000 };

        expect(await accept(fragments[0], t0 + 500, asB)).toEqual({ status: 'in-progress' });
        expect(await accept(fragments[1], t0 + 1_001, asB)).toMatchObject({
          status: 'complete',
          opened: false,
          sequence: { scope, sequenceId: ref.sequenceId, fragments: 2, bytes: 2 },
        });
        expect(await accept(fragments[0], t0 + 1_500, { consumerId: 'consumer-a' })).toEqual({
          status: 'in-progress',
        });
      });

      it('lets only the lease holder finish: a stale holder cannot overwrite the outcome', async () => {
        const { fragments, ref } = await completeBy('consumer-a', 1_000);
        const asB = { consumerId: 'consumer-b', leaseMs: 1_000 };
        const finishAs = (consumerId: string, outcome: 'completed' | 'failed', at: number) =>
          store.finish(ref, outcome, { now: at, retentionMs: 60_000, consumerId, reason: 'x: y' });

        expect(await finishAs('consumer-b', 'failed', t0 + 10)).toBe(false);
        expect(await accept(fragments[0], t0 + 20, asB)).toEqual({ status: 'in-progress' });

        // consumer-a's lease lapses; consumer-b takes over and completes it.
        expect(await accept(fragments[0], t0 + 1_001, asB)).toMatchObject({ status: 'complete' });
        expect(await finishAs('consumer-a', 'failed', t0 + 1_002)).toBe(false);
        expect(await payloadOf(ref)).toBe('pq');
        expect(await finishAs('consumer-b', 'completed', t0 + 1_003)).toBe(true);

        // Once finished, nobody finishes it again, whatever they claim.
        expect(await finishAs('consumer-a', 'failed', t0 + 1_004)).toBe(false);
        expect(await finishAs('consumer-b', 'failed', t0 + 1_005)).toBe(false);
        expect(await accept(fragments[1], t0 + 1_006)).toMatchObject({
          status: 'finished',
          outcome: 'completed',
        });
      });

      it('lets the holder finish after its lease lapsed when nobody took over', async () => {
        const { fragments, ref } = await completeBy('consumer-a', 1_000);

        expect(
          await store.finish(ref, 'completed', {
            now: t0 + 5_000,
            retentionMs: 60_000,
            consumerId: 'consumer-a',
          }),
        ).toBe(true);
        expect(await accept(fragments[0], t0 + 5_001)).toMatchObject({
          status: 'finished',
          outcome: 'completed',
        });
      });

      it('renews the lease for its holder only', async () => {
        const { fragments, ref } = await completeBy('consumer-a', 1_000);

        expect(await store.renewLease(ref, 'consumer-b', 1_000, t0 + 900)).toBe(false);
        expect(await store.renewLease(ref, 'consumer-a', 1_000, t0 + 900)).toBe(true);
        const asB = { consumerId: 'consumer-b' };
        expect(await accept(fragments[1], t0 + 1_500, asB)).toEqual({ status: 'in-progress' });
        expect(await accept(fragments[1], t0 + 1_901, asB)).toMatchObject({ status: 'complete' });
        expect(await store.renewLease(ref, 'consumer-a', 1_000, t0 + 2_000)).toBe(false);
      });

      it('does not renew a lapsed lease, nor one on an incomplete sequence', async () => {
        const { ref } = await completeBy('consumer-a', 1_000);
        const incomplete = sequenceFixture(scope, ['1', '2']);
        await accept(incomplete.fragments[0]);

        expect(await store.renewLease(ref, 'consumer-a', 1_000, t0 + 1_001)).toBe(false);
        expect(await store.renewLease(incomplete.ref, 'consumer-a', 1_000, t0)).toBe(false);
      });

      it('lets a redelivered fragment take over at once after the holder released the lease', async () => {
        const { fragments, ref } = await completeBy('consumer-a', 30_000);

        await store.releaseLease(ref, 'consumer-a', t0 + 100);
        expect(await accept(fragments[0], t0 + 100, { consumerId: 'consumer-b' })).toMatchObject({
          status: 'complete',
          opened: false,
          sequence: { scope, sequenceId: ref.sequenceId, fragments: 2, bytes: 2 },
        });
      });

      it('never says that a copy taking a complete sequence over stored its body', async () => {
        const { fragments, ref } = await completeBy('consumer-a', 30_000);
        await store.releaseLease(ref, 'consumer-a', t0 + 100);

        // Other bytes under the same CRC-32: the store keeps the body it holds.
        const copy = { ...fragments[1], body: Buffer.from('Q') };
        const takeover = await accept(copy, t0 + 100, { consumerId: 'consumer-b' });
        expect(takeover).toMatchObject({ status: 'complete', opened: false });
        // Left out, it reads as false: only `true` would be wrong.
        expect((takeover as { stored?: boolean }).stored).not.toBe(true);
        expect(await payloadOf(ref)).toBe('pq');
      });

      it('ignores a release by a consumer that does not hold the lease', async () => {
        const { fragments, ref } = await completeBy('consumer-a', 30_000);

        await store.releaseLease(ref, 'consumer-b', t0 + 100);
        expect(await accept(fragments[0], t0 + 100, { consumerId: 'consumer-b' })).toEqual({
          status: 'in-progress',
        });
        expect(await store.renewLease(ref, 'consumer-a', 30_000, t0 + 200)).toBe(true);
      });

      it('resolves and changes nothing when releasing an unknown or incomplete sequence', async () => {
        const incomplete = sequenceFixture(scope, ['1', '2']);
        await accept(incomplete.fragments[0]);
        const before = await store.stats(t0);

        await expect(
          store.releaseLease({ scope, sequenceId: 'never-seen' }, 'consumer-a', t0),
        ).resolves.toBeUndefined();
        await expect(store.releaseLease(incomplete.ref, 'consumer-a', t0)).resolves.toBeUndefined();
        expect(await store.stats(t0)).toEqual(before);
        expect(await accept(incomplete.fragments[1], t0 + 1)).toMatchObject({
          status: 'complete',
          opened: false,
        });
      });
    });

    describe('finish', () => {
      it('completed: drops the fragments; late duplicates get finished completed', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
        await acceptAll(fragments);

        await finishCompleted(ref, t0 + 10);
        expect(await store.stats(t0 + 10)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
        expect(await accept(fragments[1], t0 + 20)).toMatchObject({
          status: 'finished',
          outcome: 'completed',
        });
        expect(await store.stats(t0 + 20)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
      });

      it('failed: keeps the fragments readable and counted until retention, with the reason', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['abc', 'def']);
        await acceptAll(fragments);
        const reason = 'handler-failed: database unavailable';

        await store.finish(ref, 'failed', {
          now: t0,
          retentionMs: 10_000,
          consumerId: CONSUMER,
          reason,
        });
        expect(await accept(fragments[0], t0 + 1)).toEqual({
          status: 'finished',
          outcome: 'failed',
          reason,
        });
        expect(await payloadOf(ref)).toBe('abcdef');
        expect(await store.stats(t0 + 1)).toMatchObject({
          openSequences: 0,
          bufferedBytes: storedChargeOf(3, 3),
        });

        await store.listExpired(t0 + 10_001, 100);
        expect(await store.stats(t0 + 10_001)).toMatchObject({ bufferedBytes: 0 });
      });

      it('failed: evicts kept fragments oldest first, only as far as a new fragment needs', async () => {
        const kept = [0, 1, 2].map(() => sequenceFixture(scope, ['x'.repeat(100)]));
        for (const [index, { fragments, ref }] of kept.entries()) {
          await accept(fragments[0], t0 + index);
          await store.finish(ref, 'failed', {
            now: t0 + index,
            retentionMs: 600_000,
            consumerId: CONSUMER,
            reason: 'integrity-mismatch: x',
          });
        }
        const each = storedChargeOf(100);
        const next = sequenceFixture(scope, ['y'.repeat(600)]);
        // Room for the three kept ones and a bit: the new one needs the oldest one's room only.
        const limits = { maxBufferedBytes: 3 * each + storedChargeOf(600) - each + 1 };

        expect(await accept(next.fragments[0], t0 + 10, { limits })).toMatchObject({
          status: 'complete',
        });
        await expect(payloadOf(kept[0].ref)).rejects.toThrow();
        for (const { ref } of kept.slice(1)) expect(await payloadOf(ref)).toBe('x'.repeat(100));
        expect(await store.stats(t0 + 10)).toMatchObject({
          bufferedBytes: 2 * each + storedChargeOf(600),
        });
      });

      /** Two failed sequences of `keptScope`, one fragment of 100 bytes each, kept for inspection. */
      async function keepTwoFailed(keptScope: string) {
        const kept = [0, 1].map(() => sequenceFixture(keptScope, ['x'.repeat(100)]));
        for (const [index, { fragments, ref }] of kept.entries()) {
          await accept(fragments[0], t0 + index);
          await store.finish(ref, 'failed', {
            now: t0 + index,
            retentionMs: 600_000,
            consumerId: CONSUMER,
            reason: 'integrity-mismatch: x',
          });
        }
        return kept;
      }

      it('failed: keeps kept fragments when a fragment is back-pressured at its channel budget', async () => {
        const kept = await keepTwoFailed(`${scope}.kept`);
        const each = storedChargeOf(100);
        // An open sequence whose claim is all its channel may hold.
        const hog = sequenceFixture(scope, ['h'.repeat(100), 'i']);
        await accept(hog.fragments[0], t0 + 5);
        const stats = await store.stats(t0 + 5);
        const hogClaim = stats.bufferedBytes + (stats.reservedBytes ?? 0) - 2 * each;
        const next = sequenceFixture(scope, ['n']);
        // The store is one byte short for `next`: evicting the oldest kept one would make room.
        const limits = {
          maxBufferedBytes: 2 * each + hogClaim + storedChargeOf(1) - 1,
          maxChannelBufferedBytes: hogClaim,
        };

        expect(await accept(next.fragments[0], t0 + 10, { limits })).toEqual({
          status: 'backpressure',
          limit: 'maxChannelBufferedBytes',
        });
        for (const { ref } of kept) expect(await payloadOf(ref)).toBe('x'.repeat(100));
        expect(await store.stats(t0 + 10)).toMatchObject({ bufferedBytes: stats.bufferedBytes });

        // A fragment of another channel is let in: for it, the oldest kept one goes.
        const other = sequenceFixture(`${scope}.other`, ['o']);
        expect(await accept(other.fragments[0], t0 + 10, { limits })).toMatchObject({
          status: 'complete',
        });
        await expect(payloadOf(kept[0].ref)).rejects.toThrow();
        expect(await payloadOf(kept[1].ref)).toBe('x'.repeat(100));
      });

      it('failed: keeps kept fragments when evicting them all would not make room', async () => {
        const kept = await keepTwoFailed(scope);
        const each = storedChargeOf(100);
        const hog = sequenceFixture(scope, ['h'.repeat(100), 'i']);
        await accept(hog.fragments[0], t0 + 5);
        const stats = await store.stats(t0 + 5);
        const hogClaim = stats.bufferedBytes + (stats.reservedBytes ?? 0) - 2 * each;
        // Needs more than the kept ones hold: back-pressured even without them.
        const next = sequenceFixture(scope, ['n'.repeat(3_000)]);
        const limits = { maxBufferedBytes: 2 * each + hogClaim };

        expect(await accept(next.fragments[0], t0 + 10, { limits })).toEqual({
          status: 'backpressure',
          limit: 'maxBufferedBytes',
        });
        for (const { ref } of kept) expect(await payloadOf(ref)).toBe('x'.repeat(100));
        expect(await store.stats(t0 + 10)).toMatchObject({ bufferedBytes: stats.bufferedBytes });
      });

      it('rejected: drops the fragments; late fragments get finished rejected', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['a', 'b', 'c']);
        await accept(fragments[0]);

        await store.finish(ref, 'rejected', {
          now: t0,
          retentionMs: 10_000,
          consumerId: CONSUMER,
          reason: 'r: why',
        });
        expect(await store.stats(t0)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
        expect(await accept(fragments[1], t0 + 1)).toMatchObject({
          status: 'finished',
          outcome: 'rejected',
          reason: 'r: why',
        });
      });
    });

    describe('expiry', () => {
      const refs = (list: SequenceRef[]) => list.map((ref) => ref.sequenceId);

      it('fixed: lists an incomplete sequence once first fragment + ms has passed', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['1', '2', '3']);
        const fixed = { expiry: { ms: 1_000, strategy: 'fixed' as const } };
        await accept(fragments[0], t0, fixed);
        await accept(fragments[1], t0 + 800, fixed);

        expect(refs(await store.listExpired(t0 + 900, 100))).not.toContain(ref.sequenceId);
        expect(await store.listExpired(t0 + 1_001, 100)).toContainEqual(ref);
      });

      it('fixed: counts from startedAt the sequence it opens, not from when it opened', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['aa', 'bb', 'cc']);
        const expiry = { ms: 1_000, strategy: 'fixed' as const };
        await accept(fragments[0], t0 + 700, { expiry, startedAt: t0 });
        await accept(fragments[1], t0 + 800, { expiry, startedAt: t0 + 800 });

        expect(refs(await store.listExpired(t0 + 900, 100))).not.toContain(ref.sequenceId);
        expect(await store.listExpired(t0 + 1_001, 100)).toContainEqual(ref);
        expect(await store.expire(ref, t0 + 1_001, 10_000)).toMatchObject({
          firstFragmentAt: t0,
          lastFragmentAt: t0 + 800,
          ageMs: 1_001,
        });
      });

      it('sliding: lists an incomplete sequence once latest fragment + ms has passed', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['1', '2', '3']);
        const sliding = { expiry: { ms: 1_000, strategy: 'sliding' as const } };
        await accept(fragments[0], t0, sliding);
        await accept(fragments[1], t0 + 800, sliding);

        expect(refs(await store.listExpired(t0 + 1_001, 100))).not.toContain(ref.sequenceId);
        expect(await store.listExpired(t0 + 1_801, 100)).toContainEqual(ref);
      });

      describe('of an abandoned complete sequence', () => {
        /** Lease and expiry of 1 s each: abandoned from lease-until (t0 + 1 s) + 1 s. */
        const short = { leaseMs: 1_000, expiry: { ms: 1_000, strategy: 'fixed' as const } };

        it('lists it once expiry ms have passed since its lease lapsed, and no sooner', async () => {
          const { fragments, ref } = sequenceFixture(scope, ['1', '2']);
          await acceptAll(fragments, t0, short);

          expect(refs(await store.listExpired(t0 + 1_900, 100))).not.toContain(ref.sequenceId);
          expect(await store.expire(ref, t0 + 1_900, 10_000)).toBeNull();
          expect(await store.listExpired(t0 + 2_001, 100)).toContainEqual(ref);
        });

        it('expires it with every position received and none missing, then marks it expired', async () => {
          const { fragments, ref } = sequenceFixture(scope, ['aa', 'bb', 'cc']);
          await acceptAll(fragments.slice(0, 2), t0, short);
          await accept(fragments[2], t0 + 10, short);

          expect(await store.expire(ref, t0 + 2_100, 10_000)).toEqual({
            scope,
            sequenceId: ref.sequenceId,
            receivedPositions: [1, 2, 3],
            missingPositions: [],
            size: 3,
            bufferedBytes: 6,
            firstFragmentAt: t0,
            lastFragmentAt: t0 + 10,
            ageMs: 2_100,
          });
          expect(await store.stats(t0 + 2_100)).toMatchObject({
            openSequences: 0,
            bufferedBytes: 0,
          });
          expect(refs(await store.listExpired(t0 + 2_200, 100))).not.toContain(ref.sequenceId);
          expect(await accept(fragments[0], t0 + 2_200, short)).toMatchObject({
            status: 'finished',
            outcome: 'expired',
          });
        });

        it('never lists nor expires it while its holder keeps renewing the lease', async () => {
          const { fragments, ref } = sequenceFixture(scope, ['1', '2']);
          await acceptAll(fragments, t0, short);

          for (let at = t0 + 900; at <= t0 + 9_000; at += 900) {
            expect(await store.renewLease(ref, 'consumer-a', 1_000, at)).toBe(true);
            expect(refs(await store.listExpired(at, 100))).not.toContain(ref.sequenceId);
            expect(await store.expire(ref, at, 10_000)).toBeNull();
          }
        });

        it('starts the abandonment clock when the holder releases the lease', async () => {
          const { fragments, ref } = sequenceFixture(scope, ['1', '2']);
          await acceptAll(fragments, t0, { ...short, leaseMs: 30_000 });

          await store.releaseLease(ref, 'consumer-a', t0 + 5_000);
          expect(refs(await store.listExpired(t0 + 5_900, 100))).not.toContain(ref.sequenceId);
          expect(await store.listExpired(t0 + 6_001, 100)).toContainEqual(ref);
        });

        it('does not expire it once a redelivered fragment took it over', async () => {
          const { fragments, ref } = sequenceFixture(scope, ['1', '2']);
          await acceptAll(fragments, t0, short);
          expect(await store.listExpired(t0 + 2_001, 100)).toContainEqual(ref);

          const asB = { ...short, consumerId: 'consumer-b' };
          expect(await accept(fragments[0], t0 + 2_001, asB)).toMatchObject({ status: 'complete' });
          expect(await store.expire(ref, t0 + 2_002, 10_000)).toBeNull();
        });
      });

      it('honours the limit of listExpired', async () => {
        const expiry = { ms: 1_000, strategy: 'fixed' as const };
        for (let index = 0; index < 5; index++) {
          await accept(sequenceFixture(scope, ['1', '2']).fragments[0], t0, { expiry });
        }

        expect(await store.listExpired(t0 + 2_000, 3)).toHaveLength(3);
        expect(await store.listExpired(t0 + 2_000, 10)).toHaveLength(5);
      });

      it('expires a due sequence: reports what was received and missing, frees it, marks it', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['aa', 'bb', 'cc', 'dd', 'ee']);
        const expiry = { ms: 1_000, strategy: 'fixed' as const };
        await accept(fragments[2], t0, { expiry });
        await accept(fragments[0], t0 + 300, { expiry });

        expect(await store.expire(ref, t0 + 1_200, 10_000)).toEqual({
          scope,
          sequenceId: ref.sequenceId,
          receivedPositions: [1, 3],
          missingPositions: [2, 4, 5],
          size: 5,
          bufferedBytes: 4,
          firstFragmentAt: t0,
          lastFragmentAt: t0 + 300,
          ageMs: 1_200,
        });
        expect(await store.stats(t0 + 1_200)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
        expect(refs(await store.listExpired(t0 + 1_300, 100))).not.toContain(ref.sequenceId);
        expect(await accept(fragments[1], t0 + 1_300)).toMatchObject({
          status: 'finished',
          outcome: 'expired',
        });
      });

      it('reports missing positions up to the highest received when the size is unknown', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['a', 'b', 'c', 'd', 'e'], {
          streamed: true,
        });
        await acceptAll([fragments[0], fragments[3]], t0, {
          expiry: { ms: 1_000, strategy: 'fixed' },
        });

        const expired = await store.expire(ref, t0 + 2_000, 10_000);
        expect(expired).toMatchObject({ receivedPositions: [1, 4], missingPositions: [2, 3] });
        expect(expired?.size).toBeUndefined();
      });

      it('lets only one of two sweepers expire a sequence', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
        await accept(fragments[0], t0, { expiry: { ms: 1_000, strategy: 'fixed' } });

        const concurrent = await Promise.all([
          store.expire(ref, t0 + 2_000, 10_000),
          store.expire(ref, t0 + 2_000, 10_000),
        ]);
        expect(concurrent.filter((expired) => expired !== null)).toHaveLength(1);
        expect(await store.expire(ref, t0 + 2_001, 10_000)).toBeNull();
      });

      it('does not expire a sequence before its deadline', async () => {
        const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
        await accept(fragments[0], t0, { expiry: { ms: 1_000, strategy: 'fixed' } });

        expect(await store.expire(ref, t0 + 500, 10_000)).toBeNull();
        expect(await accept(fragments[1], t0 + 600)).toMatchObject({ status: 'complete' });
      });

      it('returns null for a sequence it does not know', async () => {
        expect(await store.expire({ scope, sequenceId: 'never-seen' }, t0, 10_000)).toBeNull();
      });
    });

    describe('stats', () => {
      it('counts open sequences, buffered bytes and the oldest first fragment', async () => {
        expect(await store.stats(t0)).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
        expect((await store.stats(t0)).oldestOpenAt).toBeUndefined();
        const expiry = { ms: 1_000, strategy: 'fixed' as const };
        const a = sequenceFixture(scope, ['aaaa', 'bbbb', 'cccc']);
        const b = sequenceFixture(scope, ['xx', 'yy']);
        await acceptAll(a.fragments.slice(0, 2), t0 + 10, { expiry });
        await accept(b.fragments[0], t0 + 20, { expiry });

        expect(await store.stats(t0 + 30)).toEqual({
          openSequences: 2,
          bufferedBytes: storedChargeOf(4, 4) + storedChargeOf(2),
          // Declared, not stored yet: a's third fragment (4 bytes), b's second (2 bytes).
          reservedBytes: 2 * FRAGMENT_OVERHEAD_BYTES + 4 + 2,
          oldestOpenAt: t0 + 10,
        });

        await accept(b.fragments[1], t0 + 40);
        await finishCompleted(b.ref, t0 + 50);
        await store.expire(a.ref, t0 + 2_000, 10_000);
        const after = await store.stats(t0 + 2_000);
        expect(after).toMatchObject({ openSequences: 0, bufferedBytes: 0 });
        expect(after.oldestOpenAt).toBeUndefined();
      });
    });

    describe('scopes', () => {
      it('keeps the same sequence id in two scopes apart', async () => {
        const otherScope = `${scope}.other`;
        const here = sequenceFixture(scope, ['a', 'b']);
        const there = sequenceFixture(otherScope, ['a', 'b', 'c', 'd']);
        const sameId = (fragment: FragmentRecord) => ({
          ...fragment,
          sequenceId: here.ref.sequenceId,
        });
        const thereRef = { scope: otherScope, sequenceId: here.ref.sequenceId };

        expect(await accept(here.fragments[0])).toEqual({ status: 'stored', opened: true });
        expect(await accept(sameId(there.fragments[0]))).toEqual({
          status: 'stored',
          opened: true,
        });
        expect(await accept(here.fragments[1])).toMatchObject({ status: 'complete' });
        await finishCompleted(here.ref);

        const rest = await acceptAll(there.fragments.slice(1).map(sameId));
        expect(rest.map((result) => result.status)).toEqual(['stored', 'stored', 'complete']);
        expect(await payloadOf(thereRef)).toBe('abcd');
      });
    });

    const optionalCases: OpenSequenceCaseContext = {
      store: () => store,
      scope: () => scope,
      t0: () => t0,
      accept: (fragment, at) => accept(fragment, at),
      fixture: (of, bodies) => sequenceFixture(of, bodies),
      finish: (ref, at) => finishCompleted(ref, at),
    };
    if (harness.openSequences !== false) describeOpenSequenceCases(optionalCases);
    if (harness.status !== false) describeStatusCases(optionalCases);

    it('answers ping', async () => {
      await expect(store.ping()).resolves.toBeUndefined();
    });
  });
}
