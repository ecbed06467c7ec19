import type { INestApplication } from '@nestjs/common';
import { MESSAGE_ID_HEADER, MESSAGE_KIND_HEADER, MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
import { OutboxRuntime } from '../libs/sequence/src/outbox/outbox.runtime';
import { OutboxService, SEQUENCE_TRANSPORT, type InMemoryTransport } from 'nest-sequence';
import { ModuleMetrics } from '../libs/sequence/src/kernel/module-metrics';
import { eventually } from '../libs/sequence/test/support/sequence-test-app';
import { OrdersAppModule } from '../src/app.module';
import { LIMITED_SKU } from '../src/orders/orders.catalogue';
import type { OrdersSettings } from '../src/orders/orders.environment';
import type { OrderView, StockView } from '../src/orders/orders.model';
import { OrdersService } from '../src/orders/orders.service';
import { StockReservations } from '../src/orders/stock-reservations.service';
import { npmScript, run } from './support/demo-process';
import { listenEmbedded } from './support/embedded-app';

/** The embedded defaults, whatever the environment of the test run says. */
const NO_SERVERS = {
  AMQP_URL: undefined,
  NATS_URL: undefined,
  REDIS_URL: undefined,
  DATABASE_URL: undefined,
  PAYLOAD_DIR: undefined,
  CLAIM_CHECK_ABOVE_BYTES: undefined,
  CLAIM_CHECK_KEY: undefined,
  ORDERS_CHANNEL_PREFIX: undefined,
  OUTBOX_TABLE_PREFIX: undefined,
  SERVE: undefined,
};

describe('orders demo on the embedded defaults (SQLite in memory, in-memory transport)', () => {
  it('npm run demo:orders reserves each order once, absorbs a duplicate, rejects an oversize order, rolls back an unknown sku, and checks it all', async () => {
    const exit = await run(...npmScript('demo:orders'), { ...NO_SERVERS, ORDERS: '12', PORT: '0' });

    expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 0 });
    const out = exit.stdout;
    expect(out).toContain(
      'orders demo on the in-memory transport and the sqlite outbox store (tables orders_demo_*)',
    );
    expect(out).toContain(
      '12 orders placed over HTTP, each stored with its OrderPlaced event in one transaction; 12 events published to events.OrderPlaced',
    );
    expect(out).toContain('12 reserved, 0 rejected; 12 events handled exactly once');
    expect(out).toMatch(
      /duplicate: OrderPlaced [\w-]+ \(order [\w-]+\) re-published to events\.OrderPlaced; the inbox recorded 1 duplicate, the stock side was handed it 1 time/,
    );
    expect(out).toMatch(
      /insufficient stock: order [\w-]+ for 6 x PRINT-LIMITED \(5 available\) -> REJECTED/,
    );
    expect(out).toMatch(
      /rolled back: order [\w-]+ naming unknown sku NO-SUCH-SKU -> 422; GET afterwards -> 404, events published since: 0, orders added: 0/,
    );
    expect(out).toContain('outbox_events 0 pending / 0 failed; inbox_events 0 pending / 0 failed');
    expect(out).toMatch(
      /GET \/stock\/PRINT-LIMITED -> 200 \{"sku":"PRINT-LIMITED","available":5,"reserved":0\}/,
    );
    expect(out).toContain('all checks passed');
  });

  it('npm run demo:orders refuses an ORDERS, OUTBOX_TABLE_PREFIX or ORDERS_CHANNEL_PREFIX it cannot use, naming each', async () => {
    const exit = await run(...npmScript('demo:orders'), {
      ...NO_SERVERS,
      ORDERS: '0',
      OUTBOX_TABLE_PREFIX: 'orders; DROP TABLE x',
      ORDERS_CHANNEL_PREFIX: 'with space',
    });

    expect(exit.code).toBe(2);
    expect(exit.stderr).toContain('ORDERS must be a whole number from 1 to 1000, got "0"');
    expect(exit.stderr).toContain(
      'OUTBOX_TABLE_PREFIX must be a letter or underscore, then up to 40 letters, digits or underscores, got "orders; DROP TABLE x"',
    );
    expect(exit.stderr).toContain('ORDERS_CHANNEL_PREFIX may hold up to 64 of');
  });

  describe('in process, over HTTP', () => {
    const settings: OrdersSettings = { channelPrefix: 'e2e.', tablePrefix: 'orders_e2e_' };
    const channel = 'e2e.events.OrderPlaced';
    let app: INestApplication;
    let base: string;

    const get = async <Body = unknown>(path: string) => {
      const response = await fetch(base + path);
      return { status: response.status, body: (await response.json()) as Body };
    };
    const post = async <Body = unknown>(path: string, body: unknown) => {
      const response = await fetch(base + path, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
      return { status: response.status, body: (await response.json()) as Body };
    };
    const stock = async (sku: string) => (await get<StockView>(`/stock/${sku}`)).body;
    /** Places an order and waits until the stock side has decided on it. */
    const placeAndDecide = async (items: unknown[]) => {
      const placed = await post<OrderView>('/orders', { items });
      expect(placed.status).toBe(201);
      await app.get(OrdersService).whenDecided([placed.body.id], 10_000);
      await app.get(OutboxRuntime).idle();
      return (await get<OrderView>(`/orders/${placed.body.id}`)).body;
    };
    const counter = async (suffix: string, labels: Record<string, string>) => {
      const metrics = await app.get(ModuleMetrics).registry.getMetricsAsJSON();
      return (metrics.find((metric) => metric.name.endsWith(suffix))?.values ?? [])
        .filter((value) => Object.entries(labels).every(([k, v]) => value.labels[k] === v))
        .reduce((sum, { value }) => sum + value, 0);
    };
    const published = () => counter('outbox_published_total', { box: 'outbox_events' });

    beforeEach(async () => {
      ({ app, base } = await listenEmbedded(OrdersAppModule.register(settings)));
    });

    afterEach(async () => {
      await app.close();
    });

    it('places an order (201, PLACED), then reserves its stock once: RESERVED, stock moved by exactly its quantities', async () => {
      const placed = await post<OrderView>('/orders', {
        items: [
          { sku: 'KEYBOARD-TKL', qty: 2 },
          { sku: 'USB-C-CABLE', qty: 3 },
        ],
      });

      expect(placed).toEqual({
        status: 201,
        body: expect.objectContaining({ status: 'PLACED', reservation: null }),
      });
      await app.get(OrdersService).whenDecided([placed.body.id], 10_000);
      expect(await get(`/orders/${placed.body.id}`)).toEqual({
        status: 200,
        body: {
          id: placed.body.id,
          status: 'RESERVED',
          items: [
            { sku: 'KEYBOARD-TKL', qty: 2 },
            { sku: 'USB-C-CABLE', qty: 3 },
          ],
          eventId: placed.body.eventId,
          placedAt: placed.body.placedAt,
          reservation: { status: 'RESERVED', reason: null, decidedAt: expect.any(String) },
        },
      });
      expect(await stock('KEYBOARD-TKL')).toEqual({
        sku: 'KEYBOARD-TKL',
        available: 99_998,
        reserved: 2,
      });
      expect(await stock('USB-C-CABLE')).toEqual({
        sku: 'USB-C-CABLE',
        available: 99_997,
        reserved: 3,
      });
      expect(app.get(StockReservations).handledTimes(placed.body.eventId)).toBe(1);
      const record = await app.get(OutboxService).record('outbox_events', placed.body.eventId);
      expect(record).toMatchObject({ status: 'COMPLETED', type: 'OrderPlaced', attempts: 1 });
    });

    it.each([
      ['no items', {}, 'items'],
      ['an empty list', { items: [] }, 'items must contain at least 1 elements'],
      [
        'a quantity of 0',
        { items: [{ sku: 'KEYBOARD-TKL', qty: 0 }] },
        'qty must not be less than 1',
      ],
      [
        'a fractional quantity',
        { items: [{ sku: 'KEYBOARD-TKL', qty: 1.5 }] },
        'qty must be an integer',
      ],
      [
        'a quantity as text',
        { items: [{ sku: 'KEYBOARD-TKL', qty: '2' }] },
        'qty must be an integer',
      ],
      ['a lower-case sku', { items: [{ sku: 'keyboard', qty: 1 }] }, 'sku must be 1-40 upper-case'],
      [
        'a sku twice',
        {
          items: [
            { sku: 'KEYBOARD-TKL', qty: 1 },
            { sku: 'KEYBOARD-TKL', qty: 2 },
          ],
        },
        'items must name each sku once',
      ],
      [
        'an unknown field',
        { items: [{ sku: 'KEYBOARD-TKL', qty: 1, discount: 100 }] },
        'property discount should not exist',
      ],
    ])(
      'answers 400 to a body with %s, naming the problem, and stores nothing',
      async (_, body, problem) => {
        const answer = await post<{ message: string[] }>('/orders', body);

        expect(answer.status).toBe(400);
        expect(answer.body.message.join('; ')).toContain(problem);
        expect(await app.get(OrdersService).count()).toBe(0);
        expect(await app.get(OutboxService).stats('outbox_events')).toMatchObject({ pending: 0 });
      },
    );

    it('rejects an order for more than is left, as a business outcome: REJECTED with the reason, stock untouched, the event handled once', async () => {
      const order = await placeAndDecide([
        { sku: 'MONITOR-27', qty: 1 },
        { sku: LIMITED_SKU, qty: 6 },
      ]);

      expect(order).toMatchObject({
        status: 'REJECTED',
        reservation: {
          status: 'REJECTED',
          reason: 'insufficient stock of PRINT-LIMITED: 6 asked, 5 available',
        },
      });
      // The monitor line was taken first, then given back with the rest.
      expect(await stock('MONITOR-27')).toEqual({
        sku: 'MONITOR-27',
        available: 100_000,
        reserved: 0,
      });
      expect(await stock(LIMITED_SKU)).toEqual({ sku: LIMITED_SKU, available: 5, reserved: 0 });
      expect(await app.get(OutboxService).record('inbox_events', order.eventId)).toMatchObject({
        status: 'COMPLETED',
        attempts: 1,
      });
      expect(app.get(StockReservations).handledTimes(order.eventId)).toBe(1);
    });

    it('drops a duplicate of a published OrderPlaced, as a relay retry would send it: handled once, stock reserved once', async () => {
      const order = await placeAndDecide([{ sku: 'MOUSE-WIRELESS', qty: 4 }]);
      const record = await app.get(OutboxService).record('outbox_events', order.eventId);
      expect(record?.status).toBe('COMPLETED');
      const broker = app.get<InMemoryTransport>(SEQUENCE_TRANSPORT);

      await broker.publish(channel, Buffer.from(record!.body), {
        ...record!.headers,
        [MESSAGE_ID_HEADER]: record!.id,
        [MESSAGE_KIND_HEADER]: 'event',
        [MESSAGE_TYPE_HEADER]: 'OrderPlaced',
        'content-type': 'application/json',
      });
      await eventually(
        async () => (await counter('inbox_received_total', { outcome: 'duplicate' })) === 1,
        'the inbox to record the duplicate',
      );
      await broker.whenIdle();
      await app.get(OutboxRuntime).idle();

      expect(broker.peek(channel)).toEqual([]); // acked, not requeued
      expect(broker.peek(`${channel}.dlq`)).toEqual([]); // nor dead-lettered
      expect(app.get(StockReservations).handledTimes(order.eventId)).toBe(1);
      expect(await stock('MOUSE-WIRELESS')).toEqual({
        sku: 'MOUSE-WIRELESS',
        available: 99_996,
        reserved: 4,
      });
      expect(await app.get(OutboxService).record('inbox_events', order.eventId)).toMatchObject({
        status: 'COMPLETED',
        attempts: 1,
      });
    });

    it('rolls back an order naming an unknown sku: 422 with the id it would have had, no order under it, no event published', async () => {
      const answer = await post<{ orderId: string; sku: string; message: string }>('/orders', {
        items: [
          { sku: 'KEYBOARD-TKL', qty: 1 },
          { sku: 'NO-SUCH-SKU', qty: 1 },
        ],
      });
      await app.get(OutboxRuntime).idle();

      expect(answer.status).toBe(422);
      expect(answer.body).toMatchObject({
        sku: 'NO-SUCH-SKU',
        orderId: expect.any(String),
        message: expect.stringContaining('was rolled back'),
      });
      // The order's row was written before the unknown sku was found: it went with the rollback.
      expect((await get(`/orders/${answer.body.orderId}`)).status).toBe(404);
      expect(await app.get(OrdersService).count()).toBe(0);
      expect(await published()).toBe(0);
      expect(await stock('KEYBOARD-TKL')).toMatchObject({ available: 100_000, reserved: 0 });

      // The relay is running: the next committed order is published at once.
      const next = await placeAndDecide([{ sku: 'KEYBOARD-TKL', qty: 1 }]);
      expect(next.status).toBe('RESERVED');
      expect(await published()).toBe(1);
    });

    it('answers 404 for an order or a product that does not exist', async () => {
      expect(await get('/orders/no-such-order')).toMatchObject({
        status: 404,
        body: { message: 'no order no-such-order' },
      });
      expect(await get('/stock/NO-SUCH-SKU')).toMatchObject({
        status: 404,
        body: { message: 'no product NO-SUCH-SKU in stock' },
      });
    });
  });
});
