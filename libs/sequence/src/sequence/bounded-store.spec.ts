import { Readable } from 'node:stream';
import { MemorySequenceStore } from '../adapters/stores/memory/memory.sequence-store';
import { SequenceStoreTimeoutError } from '../core/errors/sequence-store-timeout.error';
import type { SequenceStore } from '../ports/sequence-store.port';
import { boundedSequenceStore } from './bounded-store';

const ref = { scope: 'scans', sequenceId: 's1' };

describe('boundedSequenceStore', () => {
  it('keeps what the store says of itself, and only the optional steps it has', () => {
    const memory = boundedSequenceStore(new MemorySequenceStore(), 1_000);
    expect(memory).toMatchObject({ name: 'memory', encrypts: false });
    expect([memory.listOpen, memory.status, memory.inspect]).toEqual([
      expect.any(Function),
      expect.any(Function),
      expect.any(Function),
    ]);

    const bare = { name: 'bare', verifiesReads: true } as unknown as SequenceStore;
    const bounded = boundedSequenceStore(bare, 1_000);
    expect(bounded.verifiesReads).toBe(true);
    expect(bounded.listOpen).toBeUndefined();
    expect(bounded.status).toBeUndefined();
    expect(bounded.inspect).toBeUndefined();
  });

  it('rejects, rather than throws, a step of a store that throws before it returns a promise', async () => {
    // A store of yours with a synchronous check: called from a lease's timer, a throw would be
    // an uncaught exception.
    const throwing = () => {
      throw new Error('not connected');
    };
    const store = {
      name: 'eager',
      renewLease: throwing,
      ping: throwing,
    } as unknown as SequenceStore;
    const bounded = boundedSequenceStore(store, 50);

    let renewing: Promise<boolean> | undefined;
    expect(() => (renewing = bounded.renewLease(ref, 'token', 1_000, 0))).not.toThrow();
    await expect(renewing).rejects.toThrow('not connected');
    await expect((async () => bounded.ping())()).rejects.toThrow('not connected');
  });

  it('gives up on a step that never settles, and on a read whose next chunk never comes', async () => {
    const stalled = new Readable({ read() {} });
    stalled.push(Buffer.from('first'));
    const store = {
      name: 'stalled',
      finish: () => new Promise(() => undefined),
      read: () => stalled,
    } as unknown as SequenceStore;
    const bounded = boundedSequenceStore(store, 50);

    await expect(
      bounded.finish(ref, 'completed', { now: 0, retentionMs: 1, consumerId: 'c' }),
    ).rejects.toMatchObject({
      code: 'sequence-store-timeout',
      call: 'finish',
      subject: 'scans/s1',
    });

    const chunks: Buffer[] = [];
    const reading = (async () => {
      for await (const chunk of bounded.read(ref)) chunks.push(chunk as Buffer);
    })();
    await expect(reading).rejects.toBeInstanceOf(SequenceStoreTimeoutError);
    expect(Buffer.concat(chunks).toString()).toBe('first');
    // The store's own stream is let go of.
    expect(stalled.destroyed).toBe(true);
  });
});
