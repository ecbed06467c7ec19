import type { BoxStats } from 'nest-sequence/ports';
import type { HttpAnswer } from './orders-api.client';
import type { OrderView, StockView } from './orders.model';

/** How one product's stock moved while the run's orders were reserved. */
export interface StockMove {
  readonly sku: string;
  /** The quantity the reserved orders asked for. */
  readonly ordered: number;
  /** How much `available` went down. */
  readonly taken: number;
  /** How much `reserved` went up. */
  readonly held: number;
}

/** Everything one run of `npm run demo:orders` observed, for the summary and the checks. */
export interface OrdersRun {
  readonly adapters: { readonly transport: string; readonly store: string };
  readonly channel: string;
  readonly tablePrefix: string;
  readonly placed: {
    readonly orders: number;
    readonly reserved: number;
    readonly rejected: number;
    /** `OrderPlaced` events the relay published while they were placed. */
    readonly published: number;
    /** Events handed to the stock side exactly once. */
    readonly handledOnce: number;
    readonly stock: readonly StockMove[];
  };
  readonly duplicate: {
    readonly eventId: string;
    readonly orderId: string;
    /** Messages the inbox recorded as duplicates after the re-publish (1 expected). */
    readonly recordedAsDuplicate: number;
    /** How many times the stock side was handed the event, in all. */
    readonly handledTimes: number;
    readonly stockBefore: readonly StockView[];
    readonly stockAfter: readonly StockView[];
  };
  readonly oversize: {
    readonly asked: number;
    readonly stockBefore: StockView;
    readonly stockAfter: StockView;
    readonly order: HttpAnswer<OrderView>;
  };
  readonly rollback: {
    readonly sku: string;
    readonly answer: HttpAnswer<{ orderId?: string; message?: string }>;
    /** `GET /orders/<the id the order would have had>`. */
    readonly lookup: HttpAnswer | undefined;
    readonly publishedAfter: number;
    readonly ordersAdded: number;
  };
  /** The boxes this app uses, at the end. */
  readonly boxes: Readonly<Record<'outbox_events' | 'inbox_events', BoxStats>>;
  readonly elapsedMs: number;
  /** Answers printed at the end, as a client sees them. */
  readonly shown: readonly HttpAnswer[];
}

const stockText = (stock: StockView) =>
  `${stock.sku} ${stock.available} available / ${stock.reserved} reserved`;

/** The summary lines the demo prints. */
export function describeRun(run: OrdersRun): string[] {
  const { placed, duplicate, oversize, rollback, boxes } = run;
  const lines = [
    `orders demo on the ${run.adapters.transport} transport and the ${run.adapters.store} outbox store (tables ${run.tablePrefix}*)`,
    `  ${placed.orders} orders placed over HTTP, each stored with its OrderPlaced event in one transaction; ${placed.published} events published to ${run.channel}`,
    `  ${placed.reserved} reserved, ${placed.rejected} rejected; ${placed.handledOnce} events handled exactly once by the stock side`,
    `  stock taken: ${placed.stock.map((move) => `${move.sku} ${move.taken}`).join(', ')} (exactly what the orders asked)`,
    `  duplicate: OrderPlaced ${duplicate.eventId} (order ${duplicate.orderId}) re-published to ${run.channel}; ` +
      `the inbox recorded ${duplicate.recordedAsDuplicate} duplicate, the stock side was handed it ${duplicate.handledTimes} time; ` +
      `stock unchanged: ${duplicate.stockAfter.map(stockText).join(', ')}`,
    `  insufficient stock: order ${oversize.order.body.id} for ${oversize.asked} x ${oversize.stockBefore.sku} ` +
      `(${oversize.stockBefore.available} available) -> ${oversize.order.body.status}` +
      (oversize.order.body.reservation?.reason
        ? ` (${oversize.order.body.reservation.reason})`
        : ''),
    `  rolled back: order ${rollback.answer.body.orderId ?? '?'} naming unknown sku ${rollback.sku} -> ${rollback.answer.status}; ` +
      `GET afterwards -> ${rollback.lookup?.status ?? '?'}, events published since: ${rollback.publishedAfter}, orders added: ${rollback.ordersAdded}`,
    `  ${Object.entries(boxes)
      .map(([box, stats]) => `${box} ${stats.pending} pending / ${stats.failed} failed`)
      .join('; ')}`,
    `  done in ${run.elapsedMs} ms`,
  ];
  for (const answer of run.shown) {
    lines.push(
      `${answer.method} ${answer.path} -> ${answer.status} ${JSON.stringify(answer.body)}`,
    );
  }
  return lines;
}

/** What is wrong with the run: empty when everything happened once, as it should. */
export function failedChecks(run: OrdersRun): string[] {
  const { placed, duplicate, oversize, rollback, boxes } = run;
  const problems: string[] = [];
  const check = (ok: boolean, problem: string) => ok || problems.push(problem);

  check(
    placed.reserved === placed.orders && placed.rejected === 0,
    `${placed.reserved} of ${placed.orders} orders reserved and ${placed.rejected} rejected; ` +
      'everyday products have stock for all',
  );
  check(
    placed.published === placed.orders,
    `${placed.published} events published for ${placed.orders} orders`,
  );
  check(
    placed.handledOnce === placed.orders,
    `${placed.handledOnce} of ${placed.orders} events were handed to the stock side exactly once`,
  );
  for (const move of placed.stock) {
    check(
      move.taken === move.ordered && move.held === move.ordered,
      `${move.sku}: orders asked ${move.ordered}, available went down ${move.taken} and reserved up ${move.held}`,
    );
  }
  check(
    duplicate.recordedAsDuplicate === 1,
    `the inbox recorded ${duplicate.recordedAsDuplicate} duplicates after one re-publish`,
  );
  check(
    duplicate.handledTimes === 1,
    `the stock side was handed event ${duplicate.eventId} ${duplicate.handledTimes} times`,
  );
  check(
    JSON.stringify(duplicate.stockAfter) === JSON.stringify(duplicate.stockBefore),
    `the duplicate moved stock: ${JSON.stringify(duplicate.stockBefore)} -> ${JSON.stringify(duplicate.stockAfter)}`,
  );
  const rejected = oversize.order.body;
  check(
    oversize.order.status === 200 &&
      rejected.status === 'REJECTED' &&
      rejected.reservation?.status === 'REJECTED' &&
      /insufficient stock/.test(rejected.reservation.reason ?? ''),
    `the order for more ${oversize.stockBefore.sku} than exists should be REJECTED for insufficient stock: ${JSON.stringify(rejected)}`,
  );
  check(
    JSON.stringify(oversize.stockAfter) === JSON.stringify(oversize.stockBefore),
    `the rejected order moved stock: ${stockText(oversize.stockBefore)} -> ${stockText(oversize.stockAfter)}`,
  );
  check(
    rollback.answer.status === 422 && typeof rollback.answer.body.orderId === 'string',
    `an order naming an unknown sku should be answered 422 with its would-be id, got ${rollback.answer.status}`,
  );
  check(
    rollback.lookup?.status === 404,
    `the rolled-back order should not exist, GET answered ${rollback.lookup?.status ?? 'nothing'}`,
  );
  check(
    rollback.publishedAfter === 0 && rollback.ordersAdded === 0,
    `the rolled-back order left ${rollback.ordersAdded} orders and ${rollback.publishedAfter} published events`,
  );
  for (const [box, stats] of Object.entries(boxes)) {
    check(
      stats.pending === 0 && stats.failed === 0,
      `${box} holds ${stats.pending} pending and ${stats.failed} failed records at the end`,
    );
  }
  return problems;
}
