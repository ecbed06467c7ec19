import { Test } from '@nestjs/testing';
import fc from 'fast-check';
import { InMemoryTransport, ResequencerService, SequenceModule } from 'nest-sequence';

/**
 * Any arrival order, any duplication, any interleaving of keys, any concurrency of intake: per
 * key, the resequencer's output is exactly the sorted, de-duplicated input.
 */

/** One key's events 1..n, each sent 1..3 times. */
const keyEvents = fc
  .record({
    n: fc.integer({ min: 1, max: 40 }),
    copies: fc.array(fc.integer({ min: 1, max: 3 }), { minLength: 40, maxLength: 40 }),
  })
  .map(({ n, copies }) =>
    Array.from({ length: n }, (_, i) => Array<number>(copies[i]).fill(i + 1)).flat(),
  );

const run = fc.record({
  keys: fc.array(keyEvents, { minLength: 1, maxLength: 5 }),
  /** Deliveries started together (a consumer's prefetch, several instances). */
  concurrency: fc.integer({ min: 1, max: 16 }),
  seed: fc.integer(),
});

describe('property: resequencing shuffled, duplicated events', () => {
  it('delivers each key exactly its sorted, de-duplicated events, in order', async () => {
    const transport = new InMemoryTransport();
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          transport,
          tuning: { sweepers: { gaps: { intervalMs: false } } },
        }),
      ],
    }).compile();
    const app = await moduleRef.init();
    const service = app.get(ResequencerService);
    let runs = 0;

    await fc.assert(
      fc.asyncProperty(run, async ({ keys, concurrency, seed }) => {
        const name = `property-${runs++}`;
        const output = new Map<string, number[]>();
        const resequencer = service.create(
          { channel: name, gap: { timeoutMs: 60_000, policy: 'alert' } },
          (event) => {
            const seen = output.get(event.key) ?? [];
            seen.push(event.seq);
            output.set(event.key, seen);
          },
        );
        const events = keys.flatMap((seqs, key) => seqs.map((seq) => ({ key: `k${key}`, seq })));
        const order = fc.sample(fc.shuffledSubarray(events, { minLength: events.length }), {
          seed,
          numRuns: 1,
        })[0];
        for (let i = 0; i < order.length; i += concurrency) {
          const dispositions = await Promise.all(
            order.slice(i, i + concurrency).map(({ key, seq }) =>
              resequencer.receive({
                body: Buffer.from(`${key}:${seq}`),
                headers: { 'x-resequence-key': key, 'x-resequence-seq': seq },
              }),
            ),
          );
          expect(dispositions.every((each) => each.action === 'ack')).toBe(true);
        }
        keys.forEach((seqs, key) => {
          const expected = [...new Set(seqs)].sort((a, b) => a - b);
          expect(output.get(`k${key}`)).toEqual(expected);
        });
      }),
      { numRuns: 60 },
    );
    await app.close();
    await transport.close();
  });
});
