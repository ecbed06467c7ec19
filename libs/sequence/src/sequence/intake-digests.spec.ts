import { sha256Hex } from '../core/checksum';
import { IntakeDigests } from './intake-digests';

const part = (text: string) => Buffer.from(text);
const stored = Promise.resolve(true);

describe('IntakeDigests', () => {
  it('gives the SHA-256 and length of fragments that arrived in order and were stored', async () => {
    const digests = new IntakeDigests(10);
    digests.follow('c', 's', 1, part('ab'), stored);
    digests.follow('c', 's', 2, part('cd'), stored);
    digests.follow('c', 's', 3, part('e'), stored);

    await expect(digests.take('c', 's', 3)).resolves.toEqual({
      sha256: sha256Hex(part('abcde')),
      bytes: 5,
    });
    expect(digests.size).toBe(0);
  });

  it('hashes in arrival order even when the store answers out of order', async () => {
    const digests = new IntakeDigests(10);
    let storeFirst!: (stored: boolean) => void;
    digests.follow('c', 's', 1, part('ab'), new Promise((resolve) => (storeFirst = resolve)));
    digests.follow('c', 's', 2, part('cd'), stored);
    const taking = digests.take('c', 's', 2);
    storeFirst(true);

    await expect(taking).resolves.toEqual({ sha256: sha256Hex(part('abcd')), bytes: 4 });
  });

  it('has nothing for a sequence whose first fragment did not come first', async () => {
    const digests = new IntakeDigests(10);
    digests.follow('c', 's', 2, part('cd'), stored);
    digests.follow('c', 's', 1, part('ab'), stored);

    await expect(digests.take('c', 's', 2)).resolves.toBeUndefined();
  });

  it('drops a digest on a gap, and on a repeated position', async () => {
    const digests = new IntakeDigests(10);
    digests.follow('c', 'gap', 1, part('ab'), stored);
    digests.follow('c', 'gap', 3, part('ef'), stored);
    digests.follow('c', 'again', 1, part('ab'), stored);
    digests.follow('c', 'again', 1, part('ab'), stored);

    expect(digests.size).toBe(0);
    await expect(digests.take('c', 'gap', 3)).resolves.toBeUndefined();
    await expect(digests.take('c', 'again', 1)).resolves.toBeUndefined();
  });

  it('drops a digest when a fragment was not stored by its delivery, or the store failed', async () => {
    const digests = new IntakeDigests(10);
    digests.follow('c', 'not-stored', 1, part('ab'), stored);
    digests.follow('c', 'not-stored', 2, part('cd'), Promise.resolve(false));
    digests.follow('c', 'failed', 1, part('ab'), Promise.reject(new Error('down')));
    await Promise.resolve();

    await expect(digests.take('c', 'not-stored', 2)).resolves.toBeUndefined();
    await expect(digests.take('c', 'failed', 1)).resolves.toBeUndefined();
  });

  it('has nothing when the store counts more fragments than were hashed here', async () => {
    const digests = new IntakeDigests(10);
    digests.follow('c', 's', 1, part('ab'), stored);

    await expect(digests.take('c', 's', 2)).resolves.toBeUndefined();
  });

  it('keeps channels apart', async () => {
    const digests = new IntakeDigests(10);
    digests.follow('one', 's', 1, part('ab'), stored);
    digests.follow('two', 's', 1, part('xy'), stored);

    await expect(digests.take('one', 's', 1)).resolves.toMatchObject({
      sha256: sha256Hex(part('ab')),
    });
    await expect(digests.take('two', 's', 1)).resolves.toMatchObject({
      sha256: sha256Hex(part('xy')),
    });
  });

  it('holds at most `capacity` digests, dropping the oldest', async () => {
    const digests = new IntakeDigests(2);
    digests.follow('c', 'a', 1, part('a'), stored);
    digests.follow('c', 'b', 1, part('b'), stored);
    digests.follow('c', 'c', 1, part('c'), stored);

    expect(digests.size).toBe(2);
    await expect(digests.take('c', 'a', 1)).resolves.toBeUndefined();
    await expect(digests.take('c', 'c', 1)).resolves.toBeDefined();
  });

  it('follows nothing with capacity 0', () => {
    const digests = new IntakeDigests(0);
    digests.follow('c', 'a', 1, part('a'), stored);
    expect(digests.size).toBe(0);
  });
});
