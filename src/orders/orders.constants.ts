/** Injection token of the module's `OrdersSettings` (see orders.environment.ts). */
export const ORDERS_SETTINGS = Symbol('demo:orders-settings');

/** The event an order's transaction records, and the aggregate it belongs to. */
export const ORDER_PLACED = 'OrderPlaced';
export const ORDER_AGGREGATE = 'Order';

/**
 * Where the relay publishes an event of `type`, and where the inbox consumes it: the library's
 * default `events.<type>`, after `channelPrefix` (which keeps runs that share a broker apart).
 */
export function eventChannel(channelPrefix: string, type: string): string {
  return `${channelPrefix}events.${type}`;
}
