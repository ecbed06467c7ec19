import { Readable } from 'node:stream';
import fc from 'fast-check';
import {
  chunkBytes,
  fragmentCount,
  packRecords,
  planFragments,
  withLast,
} from './fragment-planner';

async function collect<T>(source: AsyncIterable<T>): Promise<T[]> {
  const items: T[] = [];
  for await (const item of source) items.push(item);
  return items;
}

/** Bytes 0, 1, 2, … (mod 256), so a misplaced or repeated byte changes the content. */
function sequentialBytes(length: number, start = 0): Buffer {
  return Buffer.from(Array.from({ length }, (_, index) => (start + index) % 256));
}

/** Splits `payload` into chunks of the given sizes, cycling through them. */
function sliceIrregularly(payload: Buffer, sizes: number[]): Buffer[] {
  const chunks: Buffer[] = [];
  for (let offset = 0, index = 0; offset < payload.length; index++) {
    const size = sizes[index % sizes.length];
    chunks.push(payload.subarray(offset, offset + size));
    offset += size;
  }
  return chunks;
}

describe('planFragments', () => {
  it('cuts an exact multiple into equal fragments', () => {
    expect(planFragments(12, 4)).toEqual([
      { position: 1, offset: 0, length: 4 },
      { position: 2, offset: 4, length: 4 },
      { position: 3, offset: 8, length: 4 },
    ]);
  });

  it('puts the remainder in a shorter last fragment', () => {
    expect(planFragments(10, 4)).toEqual([
      { position: 1, offset: 0, length: 4 },
      { position: 2, offset: 4, length: 4 },
      { position: 3, offset: 8, length: 2 },
    ]);
  });

  it('plans an empty payload as one empty fragment', () => {
    expect(planFragments(0, 4)).toEqual([{ position: 1, offset: 0, length: 0 }]);
  });

  it('plans a one-byte payload as one fragment', () => {
    expect(planFragments(1, 4)).toEqual([{ position: 1, offset: 0, length: 1 }]);
  });

  it('plans one fragment per byte when fragmentBytes is 1', () => {
    expect(planFragments(3, 1)).toEqual([
      { position: 1, offset: 0, length: 1 },
      { position: 2, offset: 1, length: 1 },
      { position: 3, offset: 2, length: 1 },
    ]);
  });

  it.each([
    [-1, 4],
    [1.5, 4],
    [Number.NaN, 4],
    [10, 0],
    [10, -4],
    [10, 2.5],
  ])('rejects totalBytes %p with fragmentBytes %p', (totalBytes, fragmentBytes) => {
    expect(() => planFragments(totalBytes, fragmentBytes)).toThrow(RangeError);
  });

  it('agrees with fragmentCount and covers the payload without gaps or overlaps', () => {
    fc.assert(
      fc.property(fc.nat(10_000), fc.integer({ min: 1, max: 2_000 }), (total, fragmentBytes) => {
        const plan = planFragments(total, fragmentBytes);
        let expectedOffset = 0;
        const misplaced = plan.filter((fragment, index) => {
          const full = index === plan.length - 1 || fragment.length === fragmentBytes;
          const ok =
            fragment.position === index + 1 &&
            fragment.offset === expectedOffset &&
            fragment.length <= fragmentBytes &&
            full;
          expectedOffset += fragment.length;
          return !ok;
        });

        expect(misplaced).toEqual([]);
        expect(plan).toHaveLength(fragmentCount(total, fragmentBytes));
        expect(expectedOffset).toBe(total);
      }),
    );
  });
});

describe('fragmentCount', () => {
  it('counts an empty payload as one fragment', () => {
    expect(fragmentCount(0, 1024)).toBe(1);
  });

  it('rounds a remainder up to one more fragment', () => {
    expect(fragmentCount(1025, 1024)).toBe(2);
  });

  it('rejects fragmentBytes below 1', () => {
    expect(() => fragmentCount(10, 0)).toThrow(RangeError);
  });
});

describe('chunkBytes', () => {
  it('re-chunks irregular source chunks into exact fragments and reproduces the bytes', async () => {
    const payload = sequentialBytes(1_000);
    // Larger than a fragment, many tiny ones, exactly one fragment, and in between.
    const chunks = sliceIrregularly(payload, [130, 1, 1, 1, 2, 64, 3, 1, 200, 7]);

    const bodies = await collect(chunkBytes(chunks, 64));

    expect(Buffer.concat(bodies).equals(payload)).toBe(true);
    expect(bodies.slice(0, -1).every((body) => body.length === 64)).toBe(true);
    expect(bodies.at(-1)!.length).toBe(1_000 % 64);
  });

  it('ends without a short fragment when the payload is an exact multiple', async () => {
    const bodies = await collect(chunkBytes([sequentialBytes(30), sequentialBytes(34)], 32));

    expect(bodies.map((body) => body.length)).toEqual([32, 32]);
  });

  it('yields exactly one empty body for an empty source', async () => {
    const bodies = await collect(chunkBytes([], 16));

    expect(bodies).toHaveLength(1);
    expect(bodies[0].length).toBe(0);
  });

  it('ignores zero-length source chunks', async () => {
    const empty = Buffer.alloc(0);
    const bodies = await collect(
      chunkBytes([empty, Buffer.from('ab'), empty, empty, Buffer.from('cd'), empty], 4),
    );

    expect(bodies.map((body) => body.toString())).toEqual(['abcd']);
  });

  it('yields a view of the source chunk, not a copy, when the chunk holds a whole fragment', async () => {
    const chunk = sequentialBytes(8);

    const [first] = await collect(chunkBytes([chunk], 8));

    expect(first.buffer).toBe(chunk.buffer);
    expect(first.byteOffset).toBe(chunk.byteOffset);
  });

  it('accepts plain Uint8Array chunks', async () => {
    const bodies = await collect(chunkBytes([new Uint8Array([1, 2, 3])], 2));

    expect(bodies.map((body) => [...body])).toEqual([[1, 2], [3]]);
  });

  it('refuses string chunks, which mean the stream had an encoding set', async () => {
    const strings = ['abc'] as unknown as Uint8Array[];

    await expect(collect(chunkBytes(strings, 2))).rejects.toThrow(TypeError);
  });

  it('rejects fragmentBytes below 1', async () => {
    await expect(collect(chunkBytes([Buffer.from('a')], 0))).rejects.toThrow(RangeError);
  });

  it('reads a Node Readable', async () => {
    const payload = sequentialBytes(5_000);
    const stream = Readable.from(sliceIrregularly(payload, [333, 17, 1_024]), {
      objectMode: false,
    });

    const bodies = await collect(chunkBytes(stream, 1_000));

    expect(Buffer.concat(bodies).equals(payload)).toBe(true);
    expect(bodies.map((body) => body.length)).toEqual([1_000, 1_000, 1_000, 1_000, 1_000]);
  });

  describe('back-pressure', () => {
    const chunkSize = 10;
    const fragmentBytes = 25;

    /** An endless source that records how many chunks it has been asked for. */
    function countingSource(): { chunks: Generator<Buffer>; produced: () => number } {
      let produced = 0;
      function* chunks(): Generator<Buffer> {
        for (;;) {
          produced++;
          yield sequentialBytes(chunkSize, produced);
        }
      }
      return { chunks: chunks(), produced: () => produced };
    }

    it('has pulled only the chunks the first fragment needed when it is taken', async () => {
      const source = countingSource();
      const fragments = chunkBytes(source.chunks, fragmentBytes);

      const first = await fragments.next();

      expect(first.value).toHaveLength(fragmentBytes);
      // 25 bytes need ceil(25 / 10) = 3 chunks of 10.
      expect(source.produced()).toBe(3);
      await fragments.return(undefined);
    });

    it('never holds more than one fragment plus one source chunk unconsumed', async () => {
      const source = countingSource();
      const fragments = chunkBytes(source.chunks, fragmentBytes);

      let consumedBytes = 0;
      for (let taken = 0; taken < 50; taken++) {
        const next = await fragments.next();
        consumedBytes += (next.value as Buffer).length;
        const heldBytes = source.produced() * chunkSize - consumedBytes;
        expect(heldBytes).toBeLessThan(fragmentBytes + chunkSize);
      }
      await fragments.return(undefined);
    });

    it('closes the source when the consumer stops early', async () => {
      let closed = false;
      function* source(): Generator<Buffer> {
        try {
          for (;;) yield Buffer.alloc(4);
        } finally {
          closed = true;
        }
      }

      for await (const body of chunkBytes(source(), 4)) {
        expect(body).toHaveLength(4);
        break;
      }

      expect(closed).toBe(true);
    });
  });

  it('reproduces any byte stream and never yields a body over fragmentBytes', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.uint8Array({ maxLength: 300 }), { maxLength: 20 }),
        fc.integer({ min: 1, max: 128 }),
        async (chunks, fragmentBytes) => {
          const bodies = await collect(chunkBytes(chunks, fragmentBytes));

          expect(Buffer.concat(bodies).equals(Buffer.concat(chunks))).toBe(true);
          expect(bodies.length).toBeGreaterThanOrEqual(1);
          expect(bodies.every((body) => body.length <= fragmentBytes)).toBe(true);
          expect(bodies.slice(0, -1).every((body) => body.length === fragmentBytes)).toBe(true);
        },
      ),
    );
  });
});

describe('packRecords', () => {
  const record = (text: string): Buffer => Buffer.from(text);
  const texts = (bodies: Buffer[]): string[] => bodies.map((body) => body.toString());

  it('joins records that fit together into one fragment', async () => {
    const bodies = await collect(packRecords([record('aaa'), record('bb'), record('c')], 8));

    expect(texts(bodies)).toEqual(['aaabbc']);
  });

  it('starts a new fragment rather than cutting a record that fits in one', async () => {
    const bodies = await collect(packRecords([record('aaaa'), record('bbbb'), record('cc')], 6));

    expect(texts(bodies)).toEqual(['aaaa', 'bbbbcc']);
  });

  it('sends a fragment as soon as records fill it exactly', async () => {
    const bodies = await collect(packRecords([record('aaa'), record('bbb'), record('c')], 6));

    expect(texts(bodies)).toEqual(['aaabbb', 'c']);
  });

  it('cuts an oversize record at fragmentBytes after flushing the current fragment', async () => {
    const bodies = await collect(packRecords([record('xy'), record('0123456789')], 4));

    expect(texts(bodies)).toEqual(['xy', '0123', '4567', '89']);
  });

  it('lets the following records join the tail of an oversize record', async () => {
    const bodies = await collect(
      packRecords([record('0123456789'), record('a'), record('bcd')], 4),
    );

    expect(texts(bodies)).toEqual(['0123', '4567', '89a', 'bcd']);
  });

  it('yields exactly one empty body for no records', async () => {
    const bodies = await collect(packRecords([], 16));

    expect(bodies).toHaveLength(1);
    expect(bodies[0].length).toBe(0);
  });

  it('reads records from an async source', async () => {
    async function* records(): AsyncGenerator<Buffer> {
      yield record('ab');
      yield record('cde');
    }

    expect(texts(await collect(packRecords(records(), 4)))).toEqual(['ab', 'cde']);
  });

  it('reproduces any record list, never exceeds fragmentBytes, and cuts only oversize records', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.uint8Array({ maxLength: 200 }), { maxLength: 30 }),
        fc.integer({ min: 1, max: 64 }),
        async (records, fragmentBytes) => {
          const bodies = await collect(packRecords(records, fragmentBytes));

          expect(Buffer.concat(bodies).equals(Buffer.concat(records))).toBe(true);
          expect(bodies.length).toBeGreaterThanOrEqual(1);
          expect(bodies.every((body) => body.length <= fragmentBytes)).toBe(true);

          // Every fragment boundary falls on a record boundary or inside an oversize record.
          const boundaries = new Set<number>();
          let offset = 0;
          for (const body of bodies.slice(0, -1)) boundaries.add((offset += body.length));
          offset = 0;
          for (const item of records) {
            const start = offset;
            offset += item.length;
            if (item.length > fragmentBytes) continue;
            for (let inside = start + 1; inside < offset; inside++) {
              expect(boundaries.has(inside)).toBe(false);
            }
          }
        },
      ),
    );
  });
});

describe('withLast', () => {
  async function* items<T>(...values: T[]): AsyncGenerator<T> {
    yield* values;
  }

  it('marks only the final item as last', async () => {
    expect(await collect(withLast(items('a', 'b', 'c')))).toEqual([
      { value: 'a', last: false },
      { value: 'b', last: false },
      { value: 'c', last: true },
    ]);
  });

  it('marks a single item as last', async () => {
    expect(await collect(withLast(items(42)))).toEqual([{ value: 42, last: true }]);
  });

  it('yields nothing for an empty source', async () => {
    expect(await collect(withLast(items()))).toEqual([]);
  });

  it('passes undefined items through like any other', async () => {
    expect(await collect(withLast(items(undefined, undefined)))).toEqual([
      { value: undefined, last: false },
      { value: undefined, last: true },
    ]);
  });

  it('reads only one item ahead of what it has yielded', async () => {
    let pulled = 0;
    async function* counted(): AsyncGenerator<number> {
      for (let value = 1; value <= 10; value++) {
        pulled++;
        yield value;
      }
    }
    const marked = withLast(counted());

    await marked.next();

    expect(pulled).toBe(2);
    await marked.return(undefined);
  });
});
