import { randomBytes } from 'node:crypto';
import { BodyPool, recycleBody } from './body-pool';

const MiB = 1024 * 1024;

describe('the pool of released bodies', () => {
  it('lets go of buffers of an earlier size once bodies of another size are released', () => {
    const pool = new BodyPool();
    const large = Array.from({ length: 4 }, () => pool.take(8 * MiB));
    for (const body of large) expect(recycleBody(body)).toBe(true);
    expect(pool.kept).toEqual({ buffers: 4, bytes: 32 * MiB });

    const backing = new Set<ArrayBufferLike>();
    for (let i = 0; i < 20; i += 1) {
      const body = pool.take(MiB);
      expect(body.length).toBe(MiB);
      backing.add(body.buffer);
      expect(recycleBody(body)).toBe(true);
    }
    // One 1 MiB buffer, reused from the second body on; the 8 MiB ones, unused, were let go.
    expect(backing.size).toBe(1);
    expect(pool.kept.buffers).toBeLessThanOrEqual(4);
    expect(pool.kept.bytes).toBeLessThanOrEqual(4 * MiB);
  });

  it('recycles only buffers it handed out, through any view of them, once', () => {
    const pool = new BodyPool();
    expect(recycleBody(randomBytes(MiB))).toBe(false);
    expect(recycleBody(Buffer.alloc(0))).toBe(false);
    const body = pool.take(MiB);
    // A transport may hand its message a narrower view of the body (after its headers).
    const view = new Uint8Array(body.buffer, 100, 1000);
    expect(recycleBody(view)).toBe(true);
    expect(recycleBody(body)).toBe(false);
    expect(pool.kept).toEqual({ buffers: 1, bytes: MiB });
  });

  it('hands out buffers with a memory block of their own, from offset 0', () => {
    const pool = new BodyPool();
    const body = pool.take(300 * 1024);
    expect(body.byteOffset).toBe(0);
    expect(body.buffer.byteLength).toBe(300 * 1024);
  });

  it('hands a buffer up to twice as large cut to the exact size', () => {
    const pool = new BodyPool();
    const first = pool.take(2 * MiB);
    recycleBody(first);
    const second = pool.take(MiB + 1);
    expect(second.length).toBe(MiB + 1);
    expect(second.buffer).toBe(first.buffer);
  });
});
