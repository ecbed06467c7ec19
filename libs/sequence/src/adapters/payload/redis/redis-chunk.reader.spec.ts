import { RedisChunkReader } from './redis-chunk.reader';

const gone = (index: number) => new Error(`chunk ${index} is gone`);

/** Chunks `index` of `[index]`, counting the fetches started. */
function source(count: number) {
  const started: number[] = [];
  return {
    started,
    fetch: (index: number) => {
      started.push(index);
      return Promise.resolve(index < count ? Buffer.from([index]) : null);
    },
  };
}

async function readAll(reader: RedisChunkReader): Promise<number[]> {
  const bytes: number[] = [];
  for await (const chunk of reader as AsyncIterable<Buffer>) bytes.push(...chunk);
  return bytes;
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

describe('RedisChunkReader', () => {
  it('streams the chunks in order', async () => {
    const { fetch } = source(50);

    expect(await readAll(new RedisChunkReader(50, fetch, 3, gone))).toEqual(
      Array.from({ length: 50 }, (_, index) => index),
    );
  });

  it('ends at once for a payload of no chunks, fetching nothing', async () => {
    const { fetch, started } = source(0);

    expect(await readAll(new RedisChunkReader(0, fetch, 2, gone))).toEqual([]);
    expect(started).toEqual([]);
  });

  it('fetches at most readAhead + 1 chunks ahead of a consumer that stopped reading', async () => {
    const { fetch, started } = source(1_000);
    const reader = new RedisChunkReader(1_000, fetch, 2, gone);
    reader.once('data', () => reader.pause());

    for (let turn = 0; turn < 20; turn++) await tick();

    // The chunk handed over, the one in the stream's buffer, and readAhead being fetched.
    expect(started.length).toBeGreaterThanOrEqual(2);
    expect(started.length).toBeLessThanOrEqual(2 + 2);
    reader.destroy();
  });

  it('fails with gone(index) when a chunk is missing, after the chunks before it', async () => {
    const { fetch } = source(3);
    const reader = new RedisChunkReader(6, fetch, 2, gone);
    const bytes: number[] = [];

    const failure = (async () => {
      for await (const chunk of reader as AsyncIterable<Buffer>) bytes.push(...chunk);
    })();

    await expect(failure).rejects.toThrow('chunk 3 is gone');
    expect(bytes).toEqual([0, 1, 2]);
  });

  it('hands a chunk fetched in parts on one part per read, never joined, in paused and flowing mode', async () => {
    // Chunk i: parts [i, i], [], [i] (an empty part among them).
    const fetch = (index: number) =>
      Promise.resolve([Buffer.from([index, index]), Buffer.alloc(0), Buffer.from([index])]);
    const paused: Buffer[] = [];
    for await (const part of new RedisChunkReader(4, fetch, 2, gone)) paused.push(part as Buffer);
    const flowing: Buffer[] = [];
    await new Promise<void>((resolve, reject) => {
      new RedisChunkReader(4, fetch, 2, gone)
        .on('data', (part: Buffer) => flowing.push(part))
        .on('end', resolve)
        .on('error', reject);
    });

    const expected = [0, 1, 2, 3].flatMap((index) => [
      Buffer.from([index, index]),
      Buffer.from([index]),
    ]);
    expect(paused).toEqual(expected);
    expect(flowing).toEqual(expected);
  });

  it('fails with the error of a fetch that rejects', async () => {
    const reader = new RedisChunkReader(
      2,
      () => Promise.reject(new Error('connection lost')),
      1,
      gone,
    );

    await expect(readAll(reader)).rejects.toThrow('connection lost');
  });
});
