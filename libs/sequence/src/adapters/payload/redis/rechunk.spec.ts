import { randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { rechunk } from './rechunk';

async function collect(source: Buffer | Readable, size: number): Promise<Buffer[]> {
  const chunks: Buffer[] = [];
  for await (const chunk of rechunk(source, size)) chunks.push(chunk);
  return chunks;
}

describe('rechunk', () => {
  it('cuts pieces of arbitrary sizes into chunks of exactly size bytes, the last one shorter', async () => {
    const pieces = [1, 99, 1_000, 3, 4_096, 0, 250, 17].map((length) => randomBytes(length));

    const chunks = await collect(Readable.from(pieces), 1_000);

    expect(chunks.map((chunk) => chunk.length)).toEqual([1_000, 1_000, 1_000, 1_000, 1_000, 466]);
    expect(Buffer.concat(chunks).equals(Buffer.concat(pieces))).toBe(true);
  });

  it('cuts one Buffer larger than several chunks without a stream', async () => {
    const payload = randomBytes(2_500);

    const chunks = await collect(payload, 1_000);

    expect(chunks.map((chunk) => chunk.length)).toEqual([1_000, 1_000, 500]);
    expect(Buffer.concat(chunks).equals(payload)).toBe(true);
  });

  it('yields nothing for an empty source, not an empty chunk', async () => {
    expect(await collect(Buffer.alloc(0), 10)).toEqual([]);
    expect(await collect(Readable.from([Buffer.alloc(0)]), 10)).toEqual([]);
  });

  it('accepts Uint8Array and string pieces as their bytes', async () => {
    const chunks = await collect(Readable.from([new Uint8Array([104, 105]), ' there']), 4);

    expect(Buffer.concat(chunks).toString()).toBe('hi there');
  });

  it('refuses a stream of objects with a TypeError', async () => {
    await expect(collect(Readable.from([{ not: 'bytes' }]), 4)).rejects.toThrow(TypeError);
  });

  it('pulls from the source only as far as the chunk it is asked for needs', async () => {
    let produced = 0;
    async function* source(): AsyncGenerator<Buffer> {
      for (let index = 0; index < 100; index++) {
        produced += 300;
        yield Buffer.alloc(300);
      }
    }
    const chunks = rechunk(Readable.from(source()), 1_000);

    await chunks.next();

    // One chunk of 1,000 needs four pieces of 300; the stream may read a few ahead (its buffer).
    expect(produced).toBeGreaterThanOrEqual(1_200);
    expect(produced).toBeLessThanOrEqual(1_200 + 16 * 300);
    await chunks.return(undefined);
  });
});
