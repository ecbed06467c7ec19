import type { Client, Pool, PoolClient, QueryResult } from 'pg';
import { MAX_TIMER_MS } from '../../../core/async';
import { errorMessage } from '../../../core/errors/caught';
import { PostgresMigrationOutcomeUnknownError, PostgresOutboxError } from './postgres-outbox.error';
import { checkOut } from './postgres-client';
import { isConnectionError } from '../../../core/errors/connection-errors';
import { assertTablePrefix, migrationStatements, outboxMigrations } from './postgres-outbox.sql';

export interface MigrateOutboxOptions {
  /** The prefix of the tables to create or upgrade (see `PostgresOutboxStoreOptions`). @default '' */
  readonly tablePrefix?: string;
}

/**
 * Creates or upgrades the outbox tables of `tablePrefix`: applies, in name order, each file of
 * `sql/migrations` that `<tablePrefix>outbox_migrations` does not list yet, each in a transaction
 * of its own that also records it. Every step holds a transaction-level advisory lock of the
 * prefix, so several processes may migrate at once: one applies, the others wait and then find
 * nothing left to do. Idempotent.
 *
 * `clientOrPool`: a `pg` pool (a client is checked out for the duration) or a connected client
 * that is not inside a transaction.
 *
 * @returns the names of the migrations this call applied (`[]` when the schema was up to date)
 * @throws PostgresOutboxError when a migration failed: it was rolled back, nothing of it applied
 * @throws PostgresMigrationOutcomeUnknownError (a PostgresOutboxError) when the connection failed
 *   while a migration was being committed: it may or may not have been applied; migrate again
 */
export async function migrateOutbox(
  clientOrPool: Pool | Client | PoolClient,
  options: MigrateOutboxOptions = {},
): Promise<string[]> {
  const tablePrefix = options.tablePrefix ?? '';
  assertTablePrefix(tablePrefix, 'migrateOutbox options');
  if (!isPool(clientOrPool)) return applyMigrations(clientOrPool, tablePrefix);

  let broken: Error | undefined;
  const onError = (error: Error): void => {
    broken ??= error;
  };
  const client = await checkOut(clientOrPool, onError);
  try {
    return await applyMigrations(client, tablePrefix);
  } catch (error) {
    if (isConnectionError(error) || isConnectionError((error as Error).cause)) {
      broken ??= error as Error;
    }
    throw error;
  } finally {
    client.removeListener('error', onError);
    client.release(broken ?? false);
  }
}

async function applyMigrations(
  client: Client | PoolClient,
  tablePrefix: string,
): Promise<string[]> {
  const statements = migrationStatements(tablePrefix);
  const applied: string[] = [];
  for (const migration of outboxMigrations()) {
    let committing = false;
    await client.query('BEGIN ISOLATION LEVEL READ COMMITTED');
    try {
      // A multi-statement query resolves to one result per statement; the last lists the names.
      const results = (await client.query(unbounded(statements.start))) as unknown as QueryResult[];
      const done = new Set(
        results[results.length - 1].rows.map((row: { name: string }) => row.name),
      );
      if (!done.has(migration.name)) {
        await client.query(unbounded(migration.render(tablePrefix)));
        await client.query(statements.record, [migration.name]);
        applied.push(migration.name);
      }
      committing = true;
      await client.query('COMMIT');
    } catch (error) {
      // An error PostgreSQL answered COMMIT with means it rolled back; a connection that failed
      // under it leaves no answer: the commit may have happened.
      if (committing && isConnectionError(error)) {
        throw new PostgresMigrationOutcomeUnknownError(migration.name, tablePrefix, {
          cause: error,
        });
      }
      await client.query('ROLLBACK').catch(() => undefined);
      throw new PostgresOutboxError(
        'migrate',
        `migration ${migration.name} (table prefix ${JSON.stringify(tablePrefix)}) failed and ` +
          `was rolled back: ${errorMessage(error)}`,
        { cause: error },
      );
    }
  }
  return applied;
}

function isPool(candidate: Pool | Client | PoolClient): candidate is Pool {
  return 'idleCount' in candidate && 'totalCount' in candidate;
}

/**
 * A statement that may rightly take long (waiting for another instance's migration, DDL on a big
 * table): exempt from the pool's query_timeout, which bounds the store's everyday statements.
 */
function unbounded(text: string): { text: string; query_timeout: number } {
  return { text, query_timeout: MAX_TIMER_MS };
}
