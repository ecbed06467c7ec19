import fc from 'fast-check';
import type { HeaderMap } from 'nest-sequence/wire';
import type { InboundMessage } from 'nest-sequence';
import type { SequencePayload } from '../../src/core/payload-source';
import { bytes, createSequenceTestApp, type SequenceTestApp } from '../support/sequence-test-app';

/**
 * Split → shuffle → duplicate → interleave → reassemble: whatever order and duplication the broker
 * delivers, each sequence reaches its handler byte-exact, exactly once.
 */

const KiB = 1024;
const CHANNEL = 'property.round-trip';
/** Where the splitter's fragments are captured (nobody consumes it) before being redelivered. */
const CAPTURE = 'property.capture';
/** Keeps a run's fragment count small enough for 50 runs to finish quickly. */
const MAX_FRAGMENTS_PER_SEQUENCE = 64;

interface SequenceSpec {
  readonly fragmentBytes: number;
  readonly size: number;
  /** A Buffer (size on every fragment) or a stream of `chunkBytes` chunks (size on the last). */
  readonly mode: 'buffer' | 'stream';
  readonly chunkBytes: number;
  readonly seed: number;
}

/** A fragment to deliver: which sequence of the run, and which of its fragments (0-based). */
type FragmentRef = readonly [sequence: number, fragment: number];

const sequenceSpec: fc.Arbitrary<SequenceSpec> = fc
  .integer({ min: 1, max: 64 * KiB })
  .chain((fragmentBytes) =>
    fc.record({
      fragmentBytes: fc.constant(fragmentBytes),
      size: fc.integer({
        min: 0,
        max: Math.min(200 * KiB, fragmentBytes * MAX_FRAGMENTS_PER_SEQUENCE),
      }),
      mode: fc.constantFrom<SequenceSpec['mode']>('buffer', 'stream'),
      chunkBytes: fc.integer({ min: 1, max: 64 * KiB }),
      seed: fc.integer({ min: 1, max: 0x7fffffff }),
    }),
  );

function fragmentCount({ size, fragmentBytes }: SequenceSpec): number {
  return Math.max(1, Math.ceil(size / fragmentBytes));
}

/** Several sequences, and an interleaved delivery order with some fragments delivered twice. */
const run = fc.array(sequenceSpec, { minLength: 1, maxLength: 4 }).chain((specs) => {
  const refs: FragmentRef[] = specs.flatMap((spec, sequence) =>
    Array.from({ length: fragmentCount(spec) }, (_, fragment) => [sequence, fragment] as const),
  );
  return fc
    .subarray(refs, { maxLength: Math.min(refs.length, 24) })
    .chain((duplicates) => {
      const all = [...refs, ...duplicates];
      return fc.shuffledSubarray(all, { minLength: all.length, maxLength: all.length });
    })
    .map((deliveries) => ({ specs, deliveries }));
});

function payloadSource(payload: Buffer, spec: SequenceSpec): SequencePayload {
  if (spec.mode === 'buffer') return payload;
  // At most a few hundred chunks, whatever chunkBytes was drawn.
  const chunkBytes = Math.max(spec.chunkBytes, Math.ceil(payload.length / 256));
  return (async function* () {
    for (let offset = 0; offset < payload.length; offset += chunkBytes) {
      yield payload.subarray(offset, offset + chunkBytes);
    }
  })();
}

function positionOf(fragment: InboundMessage): number {
  return Number(fragment.headers['x-sequence-position']);
}

describe('Message Sequence round trip (property)', () => {
  let t: SequenceTestApp;
  let runs = 0;

  beforeAll(async () => {
    t = await createSequenceTestApp(CHANNEL);
  });

  afterAll(async () => {
    await t.close();
  });

  it('delivers every sequence byte-exact and once, however its fragments are shuffled, duplicated and interleaved', async () => {
    await fc.assert(
      fc.asyncProperty(run, async ({ specs, deliveries }) => {
        const runId = ++runs;
        const payloads = specs.map((spec) => bytes(spec.size, spec.seed));
        const ids = specs.map((_, index) => `run-${runId}.seq-${index}`);

        // Split each payload with the real splitter, keeping its fragments in position order.
        const fragments: InboundMessage[][] = [];
        for (const [index, spec] of specs.entries()) {
          await t.splitter.send(CAPTURE, payloadSource(payloads[index], spec), {
            sequenceId: ids[index],
            fragmentBytes: spec.fragmentBytes,
          });
          fragments.push(t.transport.take(CAPTURE).sort((a, b) => positionOf(a) - positionOf(b)));
          expect(fragments[index]).toHaveLength(fragmentCount(spec));
        }

        for (const [sequence, fragment] of deliveries) {
          const { body, headers } = fragments[sequence][fragment];
          await t.transport.publish(CHANNEL, body, headers as HeaderMap);
        }
        await t.transport.whenIdle();

        const delivered = t.handler.deliveries.splice(0);
        expect(delivered.map((d) => d.payload.sequenceId).sort()).toEqual([...ids].sort());
        for (const [index, id] of ids.entries()) {
          const delivery = delivered.find((d) => d.payload.sequenceId === id)!;
          expect(delivery.bytes.equals(payloads[index])).toBe(true);
          expect(delivery.payload.fragments).toBe(fragmentCount(specs[index]));
        }
        expect(t.transport.depth(`${CHANNEL}.dlq`)).toBe(0);
      }),
      { numRuns: 50 },
    );
  });
});
