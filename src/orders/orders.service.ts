import { randomUUID } from 'node:crypto';
import { Inject, Injectable } from '@nestjs/common';
import { OutboxService, type OutboxTransaction } from 'nest-sequence';
import { ORDER_AGGREGATE, ORDER_PLACED, ORDERS_SETTINGS } from './orders.constants';
import type { OrdersSettings } from './orders.environment';
import type {
  OrderLine,
  OrderPlacedPayload,
  OrderStatus,
  OrderView,
  ReservationStatus,
  StockView,
} from './orders.model';
import { ordersTables, type OrdersTables } from './orders.tables';
import { placeholders, query } from './sql-dialect';
import { UnknownSkuError } from './unknown-sku.error';

/** How often `whenDecided` looks at the orders table. */
const DECIDED_POLL_MS = 25;

interface OrderRow {
  id: string;
  status: OrderStatus;
  event_id: string;
  placed_at: string;
}

/**
 * The order side: places an order and records its `OrderPlaced` event in one transaction of the
 * outbox store, so that the event is published if and only if the order was stored; and reads
 * orders and stock back. Reads go through a transaction too: the store's, the one connection to
 * the embedded database.
 */
@Injectable()
export class OrdersService {
  private readonly tables: OrdersTables;

  constructor(
    private readonly outbox: OutboxService,
    @Inject(ORDERS_SETTINGS) settings: OrdersSettings,
  ) {
    this.tables = ordersTables(settings.tablePrefix);
  }

  /**
   * Stores the order (`PLACED`) and its lines, and records `OrderPlaced`; all commit together.
   * @throws UnknownSkuError when a line names a product the catalogue lacks: the transaction
   *   rolls back, the order's row and event with it
   */
  async place(items: readonly OrderLine[]): Promise<OrderView> {
    const id = randomUUID();
    const eventId = randomUUID();
    const placedAt = new Date().toISOString();
    const { orders, orderItems, stock } = this.tables;
    await this.outbox.transaction(async (tx) => {
      await query(
        tx,
        `INSERT INTO ${orders} (id, status, event_id, placed_at) VALUES (?, ?, ?, ?)`,
        [id, 'PLACED' satisfies OrderStatus, eventId, placedAt],
      );
      for (const { sku, qty } of items) {
        // Only a product the stock table holds gives a row to insert. The CAST types the
        // parameter for PostgreSQL, which does not infer it from the target column here.
        const line = await query(
          tx,
          `INSERT INTO ${orderItems} (order_id, sku, qty) ` +
            `SELECT ?, sku, CAST(? AS INTEGER) FROM ${stock} WHERE sku = ?`,
          [id, qty, sku],
        );
        if (line.rowCount === 0) throw new UnknownSkuError(sku, id);
      }
      tx.publishEvent<OrderPlacedPayload>({
        id: eventId,
        type: ORDER_PLACED,
        aggregateType: ORDER_AGGREGATE,
        aggregateId: id,
        payload: { orderId: id, items: items.map(({ sku, qty }) => ({ sku, qty })) },
      });
    });
    return { id, status: 'PLACED', items, eventId, placedAt, reservation: null };
  }

  /** The order with its lines and reservation, or `undefined` when there is none of that id. */
  async find(id: string): Promise<OrderView | undefined> {
    return this.outbox.transaction(async (tx) => {
      const { orders, orderItems, reservations } = this.tables;
      const [order] = (
        await query<OrderRow>(
          tx,
          `SELECT id, status, event_id, placed_at FROM ${orders} WHERE id = ?`,
          [id],
        )
      ).rows;
      if (!order) return undefined;
      const items = await query<{ sku: string; qty: number }>(
        tx,
        `SELECT sku, qty FROM ${orderItems} WHERE order_id = ? ORDER BY sku`,
        [id],
      );
      const [reservation] = (
        await query<{ status: ReservationStatus; reason: string | null; decided_at: string }>(
          tx,
          `SELECT status, reason, decided_at FROM ${reservations} WHERE order_id = ?`,
          [id],
        )
      ).rows;
      return {
        id: order.id,
        status: order.status,
        items: items.rows.map(({ sku, qty }) => ({ sku, qty: Number(qty) })),
        eventId: order.event_id,
        placedAt: order.placed_at,
        reservation: reservation
          ? {
              status: reservation.status,
              reason: reservation.reason,
              decidedAt: reservation.decided_at,
            }
          : null,
      };
    });
  }

  /** The stock of `sku`, or `undefined` for a product the catalogue lacks. */
  async stock(sku: string): Promise<StockView | undefined> {
    return this.outbox.transaction((tx) => stockOf(tx, this.tables, sku));
  }

  /** How many orders are stored, whatever their status. */
  async count(): Promise<number> {
    return this.outbox.transaction(async (tx) => {
      const { rows } = await query<{ n: number | string }>(
        tx,
        `SELECT count(*) AS n FROM ${this.tables.orders}`,
      );
      return Number(rows[0].n); // a PostgreSQL count is a BIGINT: a string
    });
  }

  /**
   * Resolves once none of `ids` is still `PLACED` (the stock side decided on each); rejects
   * after `timeoutMs`, naming how many are left.
   */
  async whenDecided(ids: readonly string[], timeoutMs: number): Promise<void> {
    if (ids.length === 0) return;
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const placed = await this.outbox.transaction(async (tx) => {
        const { rows } = await query<{ n: number | string }>(
          tx,
          `SELECT count(*) AS n FROM ${this.tables.orders} ` +
            `WHERE status = 'PLACED' AND id IN (${placeholders(ids.length)})`,
          ids,
        );
        return Number(rows[0].n);
      });
      if (placed === 0) return;
      if (Date.now() > deadline) {
        throw new Error(
          `${placed} of ${ids.length} orders still PLACED after ${timeoutMs} ms: is the relay ` +
            'publishing and the inbox consuming? (see the warnings above)',
        );
      }
      await new Promise((resolve) => setTimeout(resolve, DECIDED_POLL_MS));
    }
  }
}

/** The stock of `sku` as `tx` sees it. */
export async function stockOf(
  tx: OutboxTransaction,
  tables: OrdersTables,
  sku: string,
): Promise<StockView | undefined> {
  const [row] = (
    await query<{ sku: string; available: number; reserved: number }>(
      tx,
      `SELECT sku, available, reserved FROM ${tables.stock} WHERE sku = ?`,
      [sku],
    )
  ).rows;
  return row && { sku: row.sku, available: Number(row.available), reserved: Number(row.reserved) };
}
