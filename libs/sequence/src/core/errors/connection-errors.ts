import { types } from 'node:util';

/**
 * Node's error codes for a peer that refused, dropped or cannot be found: a network outage, not a
 * file-system fault (`ENOENT`, `EACCES`, `EISDIR`…), which has the same shape of code.
 */
const NETWORK_CODES: ReadonlySet<string> = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'EHOSTDOWN',
  'ENETUNREACH',
  'ENETDOWN',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EADDRNOTAVAIL',
]);

/**
 * Whether `error` means the connection is gone or no longer usable (rather than a statement
 * failing on a working connection): a Node system error (its client only ever sees a socket's),
 * or a PostgreSQL connection error as `pg` reports it. The PostgreSQL store then destroys the
 * client instead of returning it to its pool.
 */
export function isConnectionError(error: unknown): boolean {
  if (!isError(error)) return false;
  const code = codeOf(error);
  return (code !== undefined && /^E[A-Z]+$/.test(code)) || isPostgresConnectionError(error);
}

/** Whether `error` is a network outage by its Node error code (see NETWORK_CODES). */
export function isNetworkError(error: unknown): boolean {
  const code = isError(error) ? codeOf(error) : undefined;
  return code !== undefined && NETWORK_CODES.has(code);
}

/**
 * Whether `error` is `pg`'s for a connection that is gone: SQLSTATE class 08 (connection
 * exception) or 57P01-57P03 (terminated by the administrator, crash shutdown, cannot connect
 * now), or the client's own terminated, closed or timed-out connection.
 */
export function isPostgresConnectionError(error: unknown): boolean {
  if (!isError(error)) return false;
  const code = codeOf(error);
  if (code !== undefined && (/^08/.test(code) || /^57P0[1-3]$/.test(code))) return true;
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

function codeOf(error: Error): string | undefined {
  const code = (error as { code?: unknown }).code;
  return typeof code === 'string' ? code : undefined;
}
