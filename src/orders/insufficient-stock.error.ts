/**
 * Less of a product is free than an order asks for. The stock side throws it inside a savepoint,
 * to undo the lines it had already reserved, and turns it into the order's rejection: a business
 * outcome, recorded once, never a handler failure to retry.
 */
export class InsufficientStockError extends Error {
  override readonly name = 'InsufficientStockError';

  constructor(
    readonly sku: string,
    readonly asked: number,
    readonly available: number,
  ) {
    super(`insufficient stock of ${sku}: ${asked} asked, ${available} available`);
  }
}
