import { types } from 'node:util';

/**
 * Whether `error` means the connection is gone or no longer usable (rather than a statement
 * failing on a working connection): a Node socket error, or a PostgreSQL connection error as `pg`
 * reports it. The PostgreSQL store then destroys the client instead of returning it to its pool;
 * the console answers 503.
 */
export function isConnectionError(error: unknown): boolean {
  if (!isError(error)) return false;
  const code = (error as { code?: unknown }).code;
  if (typeof code === 'string') {
    // Class 08: connection exception; 57P01-57P03: terminated by the administrator, crash
    // shutdown, cannot connect now; Node socket errors.
    if (/^08/.test(code) || /^57P0[1-3]$/.test(code)) return true;
    if (/^E[A-Z]+$/.test(code)) return true;
  }
  // `Query read timeout`: the client's query_timeout gave up on a statement the server may still
  // run; the client stays busy with it, so anything sent after it (a ROLLBACK) would wait too.
  return /Connection terminated|not queryable|Client was closed|Query read timeout/i.test(
    error.message,
  );
}

/**
 * Whether `value` is an Error, also one made in another realm (a Node socket error seen from a
 * `vm` context, as under Jest), which `instanceof Error` does not recognise.
 */
export function isError(value: unknown): value is Error {
  return value instanceof Error || types.isNativeError(value);
}
