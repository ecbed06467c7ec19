/**
 * An order named a product the catalogue does not hold. Thrown inside the order's transaction,
 * after its first rows were written: the transaction rolls back, so neither the order nor its
 * `OrderPlaced` event is kept, and nothing is published. The API answers 422.
 */
export class UnknownSkuError extends Error {
  override readonly name = 'UnknownSkuError';

  constructor(
    readonly sku: string,
    /** The id the order would have had: nothing is stored under it. */
    readonly orderId: string,
  ) {
    super(
      `unknown sku ${sku}: no such product in stock; order ${orderId} was rolled back, ` +
        'nothing was recorded or published (GET /stock/:sku tells which skus exist)',
    );
  }
}
