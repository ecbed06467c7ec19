import { InMemoryTransport } from '../adapters/transports/in-memory/in-memory.transport';
import type { ChannelRegistry } from './channel.registry';
import type { ConsumerHost } from './consumer.host';
import { SequenceLifecycle, type LifecyclePart } from './sequence.lifecycle';

/** A part whose stop waits until it is let go, as a sweeper waits for its run in progress. */
class SlowPart implements LifecyclePart {
  stopCalledAt?: number;
  private release!: () => void;
  private readonly released = new Promise<void>((resolve) => (this.release = resolve));

  stop(): Promise<void> {
    this.stopCalledAt = Date.now();
    return this.released;
  }

  letGo(): void {
    this.release();
  }
}

describe('SequenceLifecycle at shutdown', () => {
  const lifecycleOf = (parts: LifecyclePart[]) =>
    new SequenceLifecycle(
      new InMemoryTransport(),
      {} as ChannelRegistry,
      {} as ConsumerHost,
      parts,
    );

  it('stops every part at once: one waiting for its run does not keep the others going', async () => {
    const parts = [new SlowPart(), new SlowPart(), new SlowPart()];
    const stopping = lifecycleOf(parts).beforeApplicationShutdown();
    await Promise.resolve();

    // Every stop has been asked for while none has finished.
    expect(parts.map((part) => part.stopCalledAt !== undefined)).toEqual([true, true, true]);
    let done = false;
    void stopping.then(() => (done = true));
    parts[2].letGo();
    parts[1].letGo();
    await new Promise((resolve) => setImmediate(resolve));
    expect(done).toBe(false);
    parts[0].letGo();
    await stopping;
    expect(done).toBe(true);
  });

  it('stops the others when one part fails to stop', async () => {
    const failing: LifecyclePart = { stop: () => Promise.reject(new Error('stuck')) };
    const other = new SlowPart();
    const stopping = lifecycleOf([other, failing]).beforeApplicationShutdown();
    other.letGo();

    await expect(stopping).resolves.toBeUndefined();
    expect(other.stopCalledAt).toBeDefined();
  });
});
