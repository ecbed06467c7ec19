import { Registry } from 'prom-client';
import { InMemoryTransport } from '../adapters/transports/in-memory/in-memory.transport';
import type { ResolvedOptions } from '../options/resolved-options';
import type { ChannelBinding } from './channel-binding';
import type { ChannelRegistry } from './channel.registry';
import { ConsumerHost as ConsumerHostClass, type ConsumerHost } from './consumer.host';
import { DeadLetterMetrics } from './dead-letter.metrics';
import { ModuleMetrics } from './module-metrics';
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

describe('SequenceLifecycle: a bootstrap that fails to open a subscription', () => {
  it('stops the handlers it already started, as a shutdown would', async () => {
    const transport = new InMemoryTransport();
    const subscribe = transport.subscribe.bind(transport);
    let delivered!: () => void;
    const firstDelivered = new Promise<void>((resolve) => (delivered = resolve));
    jest.spyOn(transport, 'subscribe').mockImplementation(async (channel, ...rest) => {
      if (channel !== 'second') return subscribe(channel, ...rest);
      await firstDelivered;
      throw new Error('the broker refused the queue');
    });
    const host = new ConsumerHostClass(
      transport,
      { shutdownTimeoutMs: 50 } as ResolvedOptions,
      new DeadLetterMetrics(
        new ModuleMetrics({ metrics: { registry: new Registry(), prefix: 'nest_sequence_' } }),
      ),
    );
    // A handler that keeps failing: between its retries it waits, until `host.stopping` aborts.
    const binding = (channel: string): ChannelBinding => ({
      channel,
      kind: 'test',
      definedBy: `Test.${channel}`,
      prefetch: 1,
      describe: 'consumes',
      receive: () => {
        delivered();
        return new Promise<never>(() => undefined);
      },
    });
    const lifecycle = new SequenceLifecycle(
      transport,
      { all: () => [binding('first'), binding('second')] } as unknown as ChannelRegistry,
      host,
      [],
    );
    await transport.publish('first', Buffer.from('order 9'), {});

    await expect(lifecycle.onApplicationBootstrap()).rejects.toThrow('the broker refused');
    expect(host.stopping.aborted).toBe(true);
    expect(transport.depth('first')).toBe(1); // handed back to its channel
    await transport.close();
  });
});
