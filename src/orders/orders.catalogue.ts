/**
 * The products the demo sells, with their stock when the tables are first created. Everyday
 * products have plenty, so that the orders of many runs against one PostgreSQL database are all
 * reserved; the limited print has little, and no run takes any of it, so that an order for one
 * more than is left is rejected every time.
 */
export const EVERYDAY_SKUS = [
  'KEYBOARD-TKL',
  'MOUSE-WIRELESS',
  'MONITOR-27',
  'USB-C-CABLE',
] as const;
export const LIMITED_SKU = 'PRINT-LIMITED';

export const INITIAL_STOCK: Readonly<Record<string, number>> = {
  ...Object.fromEntries(EVERYDAY_SKUS.map((sku) => [sku, 100_000])),
  [LIMITED_SKU]: 5,
};

/** A well-formed sku the catalogue does not hold: an order naming it is rolled back. */
export const UNKNOWN_SKU = 'NO-SUCH-SKU';
