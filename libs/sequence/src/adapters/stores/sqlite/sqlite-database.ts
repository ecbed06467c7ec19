import type { Database } from 'better-sqlite3';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

/**
 * Opens a `better-sqlite3` database for a store that will own it. `better-sqlite3` is loaded
 * here, not at the top of a module: it is an optional peer of the library.
 */
export function openSqliteDatabase(filename: string): Database {
  let BetterSqlite3: typeof import('better-sqlite3');
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    BetterSqlite3 = require('better-sqlite3') as typeof import('better-sqlite3');
  } catch (error) {
    const { code, message } = error as { code?: string; message?: string };
    if (code === 'MODULE_NOT_FOUND' && message?.includes("'better-sqlite3'")) {
      throw new SequenceOptionsError('SQLite outbox store', [
        'better-sqlite3 is not installed: `npm install better-sqlite3@^12` (an optional peer ' +
          'dependency of nest-sequence, needed by the SQLite outbox store), or choose the ' +
          'PostgreSQL outbox store',
      ]);
    }
    throw error;
  }
  // timeout 0: no busy handler of SQLite's own, which sleeps inside the call and would stall the
  // event loop; the store waits for other connections' locks asynchronously instead.
  return new BetterSqlite3(filename, { timeout: 0 });
}
