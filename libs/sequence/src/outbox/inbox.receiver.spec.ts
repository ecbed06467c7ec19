import { Logger } from '@nestjs/common';
import { InMemoryTransport } from '../adapters/transports/in-memory/in-memory.transport';
import type { InboxHandlerRegistry } from '../discovery/inbox-handler.registry';
import type { OutboxMetrics } from '../observability/outbox.metrics';
import type { OutboxStore } from '../ports/outbox-store.port';
import type { MessageHandler, SubscribeOptions, Subscription } from '../ports/transport.port';
import { InboxReceiver } from './inbox.receiver';

describe('InboxReceiver', () => {
  it('stopped while it is still subscribing: closes the subscription it was opening and opens no more', async () => {
    const inner = new InMemoryTransport();
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const opened: string[] = [];
    const transport = Object.assign(Object.create(inner) as InMemoryTransport, {
      async subscribe(channel: string, handler: MessageHandler, options?: SubscribeOptions) {
        if (channel === 'events.First') await held;
        const subscription: Subscription = await inner.subscribe(channel, handler, options);
        opened.push(channel);
        return subscription;
      },
    });
    // Two inbox channels, in this order.
    const handlers = {
      channels: () =>
        new Map([
          ['events.First', [{ kind: 'event' }]],
          ['events.Second', [{ kind: 'event' }]],
        ]),
    } as unknown as InboxHandlerRegistry;
    const receiver = new InboxReceiver(
      {} as OutboxStore,
      transport,
      handlers,
      {} as OutboxMetrics,
      new Logger('test'),
      () => undefined,
    );

    const starting = receiver.start(() => 10);
    await receiver.stop(); // while the first subscription is still opening
    release();
    await starting;

    expect(opened).toEqual(['events.First']);
    await inner.publish('events.First', Buffer.from('{}'), {});
    await inner.whenIdle();
    expect(inner.depth('events.First')).toBe(1); // nobody consumes it
    await inner.close();
  });
});
