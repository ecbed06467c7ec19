import { INITIAL_STOCK } from './orders.catalogue';

/** The business tables of one table prefix. */
export interface OrdersTables {
  readonly orders: string;
  readonly orderItems: string;
  readonly stock: string;
  /** One row per order the stock side has decided on: its primary key makes that once. */
  readonly reservations: string;
}

/** `tablePrefix` is checked where it is read (orders.environment.ts): it is safe in SQL text. */
export function ordersTables(tablePrefix: string): OrdersTables {
  return {
    orders: `${tablePrefix}orders`,
    orderItems: `${tablePrefix}order_items`,
    stock: `${tablePrefix}stock`,
    reservations: `${tablePrefix}stock_reservations`,
  };
}

/**
 * The schema, in SQL that PostgreSQL and SQLite both run. Times are ISO-8601 text and quantities
 * INTEGER, which both drivers answer as JS strings and numbers (a PostgreSQL BIGINT would come back
 * as a string).
 */
export function schemaStatements(tables: OrdersTables): string[] {
  return [
    `CREATE TABLE IF NOT EXISTS ${tables.orders} (
      id TEXT PRIMARY KEY,
      status TEXT NOT NULL CHECK (status IN ('PLACED', 'RESERVED', 'REJECTED')),
      event_id TEXT NOT NULL UNIQUE,
      placed_at TEXT NOT NULL
    )`,
    `CREATE TABLE IF NOT EXISTS ${tables.stock} (
      sku TEXT PRIMARY KEY,
      available INTEGER NOT NULL CHECK (available >= 0),
      reserved INTEGER NOT NULL CHECK (reserved >= 0)
    )`,
    `CREATE TABLE IF NOT EXISTS ${tables.orderItems} (
      order_id TEXT NOT NULL REFERENCES ${tables.orders} (id),
      sku TEXT NOT NULL,
      qty INTEGER NOT NULL CHECK (qty > 0),
      PRIMARY KEY (order_id, sku)
    )`,
    `CREATE TABLE IF NOT EXISTS ${tables.reservations} (
      order_id TEXT PRIMARY KEY REFERENCES ${tables.orders} (id),
      status TEXT NOT NULL CHECK (status IN ('RESERVED', 'REJECTED')),
      reason TEXT,
      decided_at TEXT NOT NULL
    )`,
  ];
}

/** Stocks each product of the catalogue once; a later start leaves the stock as it is. */
export function seedStatements(tables: OrdersTables): { sql: string; params: unknown[] }[] {
  return Object.entries(INITIAL_STOCK).map(([sku, available]) => ({
    sql: `INSERT INTO ${tables.stock} (sku, available, reserved) VALUES (?, ?, 0) ON CONFLICT (sku) DO NOTHING`,
    params: [sku, available],
  }));
}
