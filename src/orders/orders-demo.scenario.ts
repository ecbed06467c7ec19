import type { INestApplication } from '@nestjs/common';
import { OutboxService, SEQUENCE_TRANSPORT, type Transport } from 'nest-sequence';
import type { Registry } from 'prom-client';
import { DEMO_ADAPTERS, DEMO_METRICS, type DemoAdapters } from '../infrastructure';
import { expectStatus, OrdersApiClient, plannedOrders, type HttpAnswer } from './orders-api.client';
import type { OrdersRun, StockMove } from './orders-run.report';
import { EVERYDAY_SKUS, LIMITED_SKU, UNKNOWN_SKU } from './orders.catalogue';
import { eventChannel, ORDER_PLACED } from './orders.constants';
import type { OrdersSettings } from './orders.environment';
import type { OrderLine, OrderView, StockView } from './orders.model';
import { OrdersService } from './orders.service';
import { RelayRetrySimulator } from './relay-retry.simulator';
import { StockReservations } from './stock-reservations.service';

/** Orders in flight at once: enough for their transactions and the inbox to overlap. */
const CONCURRENT_ORDERS = 4;
/** How long the relay, the broker and the inbox may take for what the run waits for. */
const SETTLE_TIMEOUT_MS = 30_000;

/**
 * The run of `npm run demo:orders`, against the app's own HTTP API at `base`: places `orders`
 * orders and waits until each is decided; publishes one of their events again, straight to the
 * broker; orders one more of the limited product than is left; and places an order naming an
 * unknown sku, which rolls back. Reads what it needs to check from the API, the outbox and the
 * module's metrics.
 */
export async function runOrdersScenario(
  app: INestApplication,
  base: string,
  orders: number,
  settings: OrdersSettings,
): Promise<OrdersRun> {
  const api = new OrdersApiClient(base);
  const service = app.get(OrdersService);
  const outbox = app.get(OutboxService);
  const counters = new OutboxCounters(app.get<Registry>(DEMO_METRICS));
  /** Every event relayed and every inbox record handled: nothing of the run is still moving. */
  const settled = (what: string) =>
    until(async () => {
      const boxes = await Promise.all([
        outbox.stats('outbox_events'),
        outbox.stats('inbox_events'),
      ]);
      return boxes.every((stats) => stats.pending === 0);
    }, what);
  // What an earlier run left unfinished (on PostgreSQL) is done before anything is measured.
  await settled('what an earlier run left pending');
  const started = Date.now();

  // Orders over HTTP: each one is stored with its event in one transaction.
  const stockBefore = await api.stockOf(EVERYDAY_SKUS);
  const publishedBefore = await counters.published();
  const placed = await inBatches(plannedOrders(orders), CONCURRENT_ORDERS, async (items) => {
    const answer = await api.placeOrder(items);
    expectStatus(answer, 201);
    return answer.body;
  });
  await service.whenDecided(
    placed.map((order) => order.id),
    SETTLE_TIMEOUT_MS,
  );
  await settled('the relay to mark every event published');
  const published = (await counters.published()) - publishedBefore;
  const decided = await inBatches(placed, CONCURRENT_ORDERS, async ({ id }) => {
    const answer = await api.order(id);
    expectStatus(answer, 200);
    return answer.body;
  });
  const stockAfter = await api.stockOf(EVERYDAY_SKUS);
  const reservations = app.get(StockReservations);

  // The duplicate: one event again, as a relay that lost its confirm would send it.
  const target = decided[0];
  const targetSkus = target.items.map((line) => line.sku);
  const duplicateStockBefore = await api.stockOf(targetSkus);
  const duplicatesBefore = await counters.duplicates();
  await app.get(RelayRetrySimulator).republish(target.eventId);
  await until(
    async () => (await counters.duplicates()) > duplicatesBefore,
    `the inbox to receive the duplicate of ${target.eventId}`,
  );
  await settled('the inbox to settle the duplicate');
  const recordedAsDuplicate = (await counters.duplicates()) - duplicatesBefore;
  const duplicateStockAfter = await api.stockOf(targetSkus);

  // One more of the limited product than is left: rejected, a business outcome.
  const limitedBefore = await api.stock(LIMITED_SKU);
  expectStatus(limitedBefore, 200);
  const asked = limitedBefore.body.available + 1;
  const oversize = await api.placeOrder([{ sku: LIMITED_SKU, qty: asked }]);
  expectStatus(oversize, 201);
  await service.whenDecided([oversize.body.id], SETTLE_TIMEOUT_MS);
  const oversizeOrder = await api.order(oversize.body.id);
  const limitedAfter = await api.stock(LIMITED_SKU);

  // An unknown sku: the transaction fails after writing the order, and everything is undone.
  const ordersBefore = await service.count();
  const publishedBeforeRollback = await counters.published();
  const rollback = await api.placeOrder([
    { sku: EVERYDAY_SKUS[0], qty: 1 },
    { sku: UNKNOWN_SKU, qty: 1 },
  ]);
  await settled('a relay woken by a commit, had there been one');
  const rolledBackId = (rollback.body as { orderId?: unknown }).orderId;
  const lookup = typeof rolledBackId === 'string' ? await api.order(rolledBackId) : undefined;

  const elapsedMs = Date.now() - started;
  return {
    adapters: {
      transport: app.get<Transport>(SEQUENCE_TRANSPORT).name,
      store:
        app.get<DemoAdapters>(DEMO_ADAPTERS).stores.find((set) => set.outboxStore)?.outboxStore
          ?.name ?? 'sqlite',
    },
    channel: eventChannel(settings.channelPrefix, ORDER_PLACED),
    tablePrefix: settings.tablePrefix,
    placed: {
      orders: placed.length,
      reserved: decided.filter((order) => order.status === 'RESERVED').length,
      rejected: decided.filter((order) => order.status === 'REJECTED').length,
      published,
      handledOnce: placed.filter((order) => reservations.handledTimes(order.eventId) === 1).length,
      stock: stockMoves(decided, stockBefore, stockAfter),
    },
    duplicate: {
      eventId: target.eventId,
      orderId: target.id,
      recordedAsDuplicate,
      handledTimes: reservations.handledTimes(target.eventId),
      stockBefore: [...duplicateStockBefore.values()],
      stockAfter: [...duplicateStockAfter.values()],
    },
    oversize: {
      asked,
      stockBefore: limitedBefore.body,
      stockAfter: limitedAfter.body,
      order: oversizeOrder,
    },
    rollback: {
      sku: UNKNOWN_SKU,
      answer: rollback as HttpAnswer<{ orderId?: string; message?: string }>,
      lookup,
      publishedAfter: (await counters.published()) - publishedBeforeRollback,
      ordersAdded: (await service.count()) - ordersBefore,
    },
    boxes: {
      outbox_events: await outbox.stats('outbox_events'),
      inbox_events: await outbox.stats('inbox_events'),
    },
    elapsedMs,
    shown: [await api.order(target.id), oversizeOrder, limitedAfter, rollback],
  };
}

/** Per everyday product: what the reserved orders asked, and how its stock moved. */
function stockMoves(
  orders: readonly OrderView[],
  before: ReadonlyMap<string, StockView>,
  after: ReadonlyMap<string, StockView>,
): StockMove[] {
  const lines: OrderLine[] = orders
    .filter((order) => order.status === 'RESERVED')
    .flatMap((order) => order.items);
  return EVERYDAY_SKUS.map((sku) => ({
    sku,
    ordered: lines.filter((line) => line.sku === sku).reduce((sum, line) => sum + line.qty, 0),
    taken: before.get(sku)!.available - after.get(sku)!.available,
    held: after.get(sku)!.reserved - before.get(sku)!.reserved,
  }));
}

/** Reads the module's Outbox / Inbox counters (prom-client), for this app's event boxes. */
class OutboxCounters {
  constructor(private readonly registry: Registry) {}

  /** Events the relay published with a confirm. */
  published(): Promise<number> {
    return this.sum('outbox_published_total', { box: 'outbox_events' });
  }

  /** Messages the inbox received and dropped, their id already there. */
  duplicates(): Promise<number> {
    return this.sum('inbox_received_total', { box: 'inbox_events', outcome: 'duplicate' });
  }

  private async sum(suffix: string, labels: Record<string, string>): Promise<number> {
    const metrics = await this.registry.getMetricsAsJSON();
    const metric = metrics.find((each) => each.name.endsWith(suffix));
    return (metric?.values ?? [])
      .filter((value) => Object.entries(labels).every(([k, v]) => value.labels[k] === v))
      .reduce((sum, { value }) => sum + value, 0);
  }
}

/** `work` on every item, at most `concurrency` at once; the results in the items' order. */
async function inBatches<T, R>(
  items: readonly T[],
  concurrency: number,
  work: (item: T) => Promise<R>,
): Promise<R[]> {
  const results: R[] = [];
  for (let i = 0; i < items.length; i += concurrency) {
    results.push(...(await Promise.all(items.slice(i, i + concurrency).map(work))));
  }
  return results;
}

/** Resolves once `condition` holds; throws, naming what it waited for, after the timeout. */
async function until(condition: () => Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + SETTLE_TIMEOUT_MS;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`waited ${SETTLE_TIMEOUT_MS} ms for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
