/** What the orders demo stores and serves. */

/** `PLACED` until the stock side has decided, then `RESERVED` or `REJECTED`. */
export type OrderStatus = 'PLACED' | 'RESERVED' | 'REJECTED';

export type ReservationStatus = Exclude<OrderStatus, 'PLACED'>;

/** One line of an order: a product and how many of it. */
export interface OrderLine {
  readonly sku: string;
  readonly qty: number;
}

/** The payload of an `OrderPlaced` event: everything the stock side needs to reserve. */
export interface OrderPlacedPayload {
  readonly orderId: string;
  readonly items: readonly OrderLine[];
}

/** What the stock side decided for one order, once. */
export interface ReservationView {
  readonly status: ReservationStatus;
  /** Why it was rejected; `null` when reserved. */
  readonly reason: string | null;
  readonly decidedAt: string;
}

/** `GET /orders/:id` (and, without a reservation yet, the answer to `POST /orders`). */
export interface OrderView {
  readonly id: string;
  readonly status: OrderStatus;
  readonly items: readonly OrderLine[];
  /** The id of the order's `OrderPlaced` event: what the inbox deduplicates by. */
  readonly eventId: string;
  readonly placedAt: string;
  /** `null` until the `OrderPlaced` event has been handled. */
  readonly reservation: ReservationView | null;
}

/** `GET /stock/:sku`: units free to reserve, and units reserved by orders. */
export interface StockView {
  readonly sku: string;
  readonly available: number;
  readonly reserved: number;
}
