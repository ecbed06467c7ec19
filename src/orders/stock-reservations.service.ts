import { Inject, Injectable } from '@nestjs/common';
import type { OutboxEvent, OutboxTransaction } from 'nest-sequence';
import { InsufficientStockError } from './insufficient-stock.error';
import { ORDERS_SETTINGS } from './orders.constants';
import type { OrdersSettings } from './orders.environment';
import type { OrderLine, OrderPlacedPayload, ReservationStatus } from './orders.model';
import { stockOf } from './orders.service';
import { ordersTables, type OrdersTables } from './orders.tables';
import { query } from './sql-dialect';

/**
 * The stock side: reserves the lines of a placed order, all or none, and records the decision —
 * `RESERVED`, or `REJECTED` with the reason when a product is short. It writes only through the
 * transaction the inbox hands it, which also marks the event done: the reservation commits exactly
 * when the event is marked handled, so a duplicate (which the inbox drops) or a crash (which rolls
 * both back) can never reserve twice. The reservation's primary key (the order id) would refuse a
 * second one anyway.
 */
@Injectable()
export class StockReservations {
  private readonly tables: OrdersTables;
  private readonly calls = new Map<string, number>();

  constructor(@Inject(ORDERS_SETTINGS) settings: OrdersSettings) {
    this.tables = ordersTables(settings.tablePrefix);
  }

  /** Reserves for the order of `event`, in `transaction`; returns what was decided. */
  async reserve(event: OutboxEvent, transaction: OutboxTransaction): Promise<ReservationStatus> {
    this.calls.set(event.id, (this.calls.get(event.id) ?? 0) + 1);
    const { orderId, items } = orderPlacedPayload(event);
    let rejection: InsufficientStockError | undefined;
    try {
      // A savepoint: when a later line is short, the lines already taken are given back.
      await transaction.savepoint(() => this.take(transaction, items));
    } catch (error) {
      if (!(error instanceof InsufficientStockError)) throw error;
      rejection = error;
    }
    const status: ReservationStatus = rejection ? 'REJECTED' : 'RESERVED';
    const { orders, reservations } = this.tables;
    await query(
      transaction,
      `INSERT INTO ${reservations} (order_id, status, reason, decided_at) VALUES (?, ?, ?, ?)`,
      [orderId, status, rejection?.message ?? null, new Date().toISOString()],
    );
    const decided = await query(
      transaction,
      `UPDATE ${orders} SET status = ? WHERE id = ? AND status = 'PLACED'`,
      [status, orderId],
    );
    if (decided.rowCount !== 1) {
      // Thrown: the savepoint undoes the reservation, and the inbox retries, then keeps the
      // event FAILED with this message for an operator.
      throw new Error(
        `event ${event.id} names order ${orderId}, which is not a PLACED order of ` +
          `${orders}: was it placed by another database?`,
      );
    }
    return status;
  }

  /** How many times the event `eventId` was handed to `reserve` by this process. */
  handledTimes(eventId: string): number {
    return this.calls.get(eventId) ?? 0;
  }

  private async take(transaction: OutboxTransaction, items: readonly OrderLine[]): Promise<void> {
    const { stock } = this.tables;
    for (const { sku, qty } of items) {
      const taken = await query(
        transaction,
        `UPDATE ${stock} SET available = available - ?, reserved = reserved + ? ` +
          'WHERE sku = ? AND available >= ?',
        [qty, qty, sku, qty],
      );
      if (taken.rowCount === 0) {
        const available = (await stockOf(transaction, this.tables, sku))?.available ?? 0;
        throw new InsufficientStockError(sku, qty, available);
      }
    }
  }
}

/**
 * The payload of an `OrderPlaced` event, checked: the inbox validated the event's envelope, but
 * its payload is whatever the producer wrote. A malformed one throws, and ends `FAILED` in the
 * inbox after its retries, with this message.
 */
export function orderPlacedPayload(event: OutboxEvent): OrderPlacedPayload {
  const payload = event.payload as Partial<OrderPlacedPayload> | null;
  const lines = payload?.items;
  const wellFormed =
    typeof payload?.orderId === 'string' &&
    Array.isArray(lines) &&
    lines.length > 0 &&
    lines.every(
      (line: Partial<OrderLine> | null) =>
        typeof line?.sku === 'string' && Number.isInteger(line.qty) && (line.qty ?? 0) > 0,
    );
  if (!wellFormed) {
    throw new Error(
      `event ${event.id} is not an OrderPlaced the stock side understands: its payload must be ` +
        '{ orderId: string, items: [{ sku: string, qty: positive integer }] }',
    );
  }
  return payload as OrderPlacedPayload;
}
