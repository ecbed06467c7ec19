import { randomUUID } from 'node:crypto';
import type { Transport } from 'nest-sequence';
import type { PublishOptions } from 'nest-sequence/ports';
import { ForwardingTransport } from 'nest-sequence/testing';
import { type HeaderMap } from 'nest-sequence/wire';
import { inboxHandler, type RecordingInboxHandler } from '../outbox/outbox-test-app';
import { eventually, metricValue } from '../support/sequence-test-app';
import { describeOnTransports, type TransportCase } from '../support/transports.fixture';
import {
  copiesById,
  createPostgresOutboxApp,
  eachTimes,
  FAST_RELAY,
  orderPlaced,
  type PostgresOutboxApp,
} from './support/outbox-app';
import { useOutboxServersOn } from './support/outbox-servers';

jest.setTimeout(30_000);

const TRANSACTIONS = 2;
const EVENTS_PER_TRANSACTION = 5;

/** A relay's transport whose every publish reaches the broker twice (a resend, a redelivery). */
class PublishingTwice extends ForwardingTransport {
  readonly name = 'publishing-twice';
  /** What it published, once per publish. */
  readonly sent: Array<{ channel: string; body: Buffer; headers: HeaderMap }> = [];

  override async publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    options?: PublishOptions,
  ): Promise<void> {
    await this.inner.publish(channel, body, headers, options);
    await this.inner.publish(channel, body, headers, options);
    this.sent.push({ channel, body, headers });
  }
}

/**
 * The Outbox and the Inbox across a real broker, each application with its own PostgreSQL
 * tables: a producer commits events and its relay publishes them to the broker; a consumer's
 * `@InboxHandler` receives them through its inbox, which runs the handler once per message id
 * however many copies the broker delivers.
 */
describeOnTransports('faults: Outbox to Inbox through the broker', ['postgres'], (on) => {
  const apps: PostgresOutboxApp[] = [];
  const servers = useOutboxServersOn(on, {
    beforeCleanup: async () => {
      for (const app of apps.splice(0).reverse()) await app.close();
    },
  });

  /** A consumer on `channel` with an `@InboxHandler` for OrderPlaced, on tables of its own. */
  async function startConsumer(channel: string) {
    const OrderPlacedHandler = inboxHandler({ event: 'OrderPlaced', channel });
    const tablePrefix = servers.postgres.newTablePrefix();
    const app = await createPostgresOutboxApp({
      tablePrefix,
      outbox: { inboxEvents: FAST_RELAY, outboxEvents: { enabled: false } },
      providers: [OrderPlacedHandler],
      on,
    });
    apps.push(app);
    const handler: RecordingInboxHandler = app.handler(OrderPlacedHandler);
    return { app, handler, tablePrefix };
  }

  /** A producer whose relay publishes every event to `channel`, through `broker`. */
  async function startProducer(channel: string, broker: TransportCase = on) {
    const app = await createPostgresOutboxApp({
      tablePrefix: servers.tablePrefix,
      outbox: { outboxEvents: FAST_RELAY, routes: { event: () => channel } },
      on: broker,
    });
    apps.push(app);
    return app;
  }

  /** Commits TRANSACTIONS transactions of EVENTS_PER_TRANSACTION OrderPlaced events. */
  async function commitOrders(producer: PostgresOutboxApp): Promise<string[]> {
    const ids: string[] = [];
    for (let t = 0; t < TRANSACTIONS; t++) {
      ids.push(
        ...(await producer.outbox.transaction(async (tx) =>
          Array.from({ length: EVENTS_PER_TRANSACTION }, () =>
            tx.publishEvent(orderPlaced(`order-${randomUUID()}`)),
          ),
        )),
      );
    }
    return ids;
  }

  const inboxRows = async (tablePrefix: string) =>
    [...(await servers.postgres.rows(tablePrefix, 'inbox_events'))].sort((a, b) =>
      a.id.localeCompare(b.id),
    );
  const completedOnce = (ids: readonly string[]) =>
    [...ids].sort().map((id) => ({ id, status: 'COMPLETED', attempts: 1, lastError: null }));

  it('publishes each committed event to the broker, and the inbox runs its handler once per message id', async () => {
    const channel = servers.admin.newChannel();
    const consumer = await startConsumer(channel);
    const producer = await startProducer(channel);

    const ids = await commitOrders(producer);

    expect(ids).toHaveLength(TRANSACTIONS * EVENTS_PER_TRANSACTION);
    await eventually(
      () => consumer.handler.calls.length === ids.length,
      'every event handled by the inbox',
    );
    await eventually(
      async () =>
        (await servers.postgres.rows(servers.tablePrefix)).every(
          (row) => row.status === 'COMPLETED',
        ),
      'every outbox record marked completed',
    );
    await consumer.app.runtime.idle();
    expect(copiesById(consumer.handler.calls.map((call) => call.id))).toEqual(eachTimes(ids, 1));
    expect(consumer.handler.calls.map((call) => call.type)).toEqual(ids.map(() => 'OrderPlaced'));
    expect(await inboxRows(consumer.tablePrefix)).toEqual(completedOnce(ids));
    expect(await servers.admin.readyCount(channel)).toBe(0);
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
  });

  it('runs the handler once per message id when the broker delivers each message twice at once and again after it was handled', async () => {
    const channel = servers.admin.newChannel();
    const consumer = await startConsumer(channel);
    let relayTransport: PublishingTwice | undefined;
    const producer = await startProducer(channel, {
      ...on,
      connect: async (name: string): Promise<Transport> =>
        (relayTransport = new PublishingTwice(await on.connect(name))),
    });
    const duplicates = () =>
      metricValue(consumer.app.metrics.registry, 'nest_sequence_inbox_received_total', {
        box: 'inbox_events',
        outcome: 'duplicate',
      });

    const ids = await commitOrders(producer);
    await eventually(
      async () => (await duplicates()) === ids.length,
      'the consumer receiving each second copy',
    );
    await consumer.app.runtime.idle();
    expect(copiesById(consumer.handler.calls.map((call) => call.id))).toEqual(eachTimes(ids, 1));

    // Late copies, long after the first was handled: a relay restarted before it could mark them.
    for (const { body, headers } of relayTransport!.sent) {
      await relayTransport!.inner.publish(channel, body, headers);
    }
    await eventually(
      async () => (await duplicates()) === 2 * ids.length,
      'the consumer receiving each late copy',
    );
    await consumer.app.runtime.idle();

    expect(relayTransport!.sent.map(({ channel: to }) => to)).toEqual(ids.map(() => channel));
    expect(copiesById(consumer.handler.calls.map((call) => call.id))).toEqual(eachTimes(ids, 1));
    expect(await inboxRows(consumer.tablePrefix)).toEqual(completedOnce(ids));
    expect(await servers.admin.readyCount(channel)).toBe(0);
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
  });
});
