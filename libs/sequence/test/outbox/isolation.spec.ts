import { AsyncLocalStorage } from 'node:async_hooks';
import { randomUUID } from 'node:crypto';
import { Injectable } from '@nestjs/common';
import { InboxHandler, OutboxService, type InboundMessage, type OutboxEvent } from 'nest-sequence';
import { MESSAGE_ID_HEADER, MESSAGE_KIND_HEADER } from 'nest-sequence/wire';
import { SqliteOutboxStore } from 'nest-sequence/sqlite';
import { eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, FAST_BOX, type OutboxTestApp } from './outbox-test-app';

/**
 * The library's own steps (a relay's claim, an inbox insert before its ack) are transactions of
 * their own. On the single SQLite connection they used to join whatever transaction the code that
 * woke them ran in (through its async context), and so published rows that were then rolled back.
 */
describe('Outbox isolation: nothing leaves with a transaction that rolls back (embedded SQLite)', () => {
  let t: OutboxTestApp;
  const published: string[] = [];

  afterEach(async () => {
    await t?.close();
    published.length = 0;
  });

  async function listen(channel: string): Promise<void> {
    await t.broker.subscribe(channel, async (message: InboundMessage) => {
      published.push(String(message.headers[MESSAGE_ID_HEADER]));
      return { action: 'ack' };
    });
  }

  /** Long enough for a relay woken by the inner commit to have claimed and published. */
  const settle = async () => {
    await t.runtime.idle();
    await t.broker.whenIdle();
    await new Promise((resolve) => setTimeout(resolve, 100));
  };

  it('an inner transaction that committed is not published when the outer one rolls back', async () => {
    t = await createOutboxTestApp({ outboxEvents: { ...FAST_BOX, pollIntervalMs: 60_000 } });
    await listen('events.OrderPlaced');
    let id = '';
    await expect(
      t.outbox.transaction(async () => {
        await t.outbox.transaction(async (inner) => {
          id = inner.publishEvent({
            type: 'OrderPlaced',
            aggregateType: 'Order',
            aggregateId: 'o-1',
            payload: {},
          });
        });
        await new Promise((resolve) => setTimeout(resolve, 50)); // the relay was woken meanwhile
        throw new Error('business rule says no (expected)');
      }),
    ).rejects.toThrow('business rule says no');
    await settle();
    expect(published).toEqual([]);
    expect(await t.outbox.record('outbox_events', id)).toBeUndefined();

    // The next commit goes out as usual.
    const next = await t.outbox.transaction(async (tx) =>
      tx.publishEvent({
        type: 'OrderPlaced',
        aggregateType: 'Order',
        aggregateId: 'o-2',
        payload: {},
      }),
    );
    await eventually(() => published.includes(next), 'the next event published');
  });

  it('an inbox handler that emits, then throws, publishes nothing', async () => {
    @Injectable()
    class Reserve {
      calls = 0;
      constructor(private readonly outbox: OutboxService) {}

      @InboxHandler({ event: 'OrderPlaced' })
      async handle(event: OutboxEvent): Promise<void> {
        this.calls++;
        await this.outbox.transaction(async (tx) => {
          tx.publishEvent({
            type: 'StockReserved',
            aggregateType: 'Stock',
            aggregateId: 'sku-1',
            payload: { order: event.id },
          });
        });
        await new Promise((resolve) => setTimeout(resolve, 20));
        throw new Error('stock service says no (expected)');
      }
    }
    t = await createOutboxTestApp(
      {
        inboxEvents: {
          ...FAST_BOX,
          retry: {
            ...FAST_BOX.retry,
            attempts: 1,
          },
        },
        outboxEvents: { ...FAST_BOX, pollIntervalMs: 60_000 },
      },
      [Reserve],
    );
    await listen('events.StockReserved');
    const id = randomUUID();
    const event = {
      id,
      type: 'OrderPlaced',
      aggregateType: 'Order',
      aggregateId: 'o-1',
      payload: {},
    };
    await t.broker.publish(
      'events.OrderPlaced',
      Buffer.from(JSON.stringify({ ...event, occurredAt: new Date().toISOString() })),
      { [MESSAGE_ID_HEADER]: id, [MESSAGE_KIND_HEADER]: 'event' },
    );
    await eventually(
      async () => (await t.outbox.record('inbox_events', id))?.status === 'FAILED',
      'the inbox record failed',
    );
    await settle();
    expect(t.app.get(Reserve).calls).toBe(1);
    expect(published).toEqual([]);
    expect(await t.outbox.stats('outbox_events')).toMatchObject({ pending: 0 });
  });

  it("an in-memory delivery does not run in the publisher's async context", async () => {
    t = await createOutboxTestApp({});
    const publisherContext = new AsyncLocalStorage<string>();
    const seen: Array<string | undefined> = [];
    await t.broker.subscribe('ctx', async () => {
      seen.push(publisherContext.getStore());
      return { action: 'ack' };
    });
    await new Promise((resolve) => setImmediate(resolve)); // no delivery round pending
    await publisherContext.run('inside a transaction', () =>
      t.broker.publish('ctx', Buffer.from('x'), {}),
    );
    await t.broker.whenIdle();
    expect(seen).toEqual([undefined]);
  });

  it('the SQLite store refuses an inbox insert inside its own transaction, rather than join it', async () => {
    const store = await SqliteOutboxStore.open({ filename: ':memory:' });
    await store.migrate();
    const record = {
      id: 'm-1',
      kind: 'event' as const,
      type: 'X',
      partitionKey: null,
      body: '{}',
      headers: {},
    };
    await expect(store.transaction(() => store.receive('inbox_events', record))).rejects.toThrow(
      /inside a transaction of the store/,
    );
    await expect(store.receive('inbox_events', record)).resolves.toBe('added');
    await store.close();
  });
});
