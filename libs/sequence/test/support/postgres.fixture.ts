/**
 * The tests' PostgreSQL: the server at `DATABASE_URL` (see ./servers.ts). Wrap the block in
 * `describeWithServer('postgres', …)`; {@link usePostgres} gives it an operator's connection and a
 * table prefix per test, and drops the test's tables after it.
 */
import { randomBytes } from 'node:crypto';
import { Client, Pool, type ClientConfig, type PoolConfig } from 'pg';
import type { BoxName, RecordStatus } from 'nest-sequence/ports';
import { SERVERS } from './servers';

/** A new pool on the test database (the caller ends it). */
export function postgresPool(config: Omit<PoolConfig, 'connectionString'> = {}): Pool {
  return new Pool({ connectionString: SERVERS.postgres.url, ...config });
}

/** A new client of the test database, not connected yet (the caller connects and ends it). */
export function postgresClient(config: Omit<ClientConfig, 'connectionString'> = {}): Client {
  return new Client({ connectionString: SERVERS.postgres.url, ...config });
}

/**
 * Runs `sql` on a connection of its own to the test PostgreSQL (as an operator would, outside any
 * pool under test) and returns its rows.
 */
export async function adminQuery<Row>(sql: string, params: unknown[] = []): Promise<Row[]> {
  const client = postgresClient();
  await client.connect();
  try {
    return (await client.query(sql, params)).rows as Row[];
  } finally {
    await client.end();
  }
}

/** A box row as an operator reads it with SQL. */
export interface BoxRow {
  readonly id: string;
  readonly status: RecordStatus;
  readonly attempts: number;
  readonly lastError: string | null;
}

/**
 * The database as an operator sees it, through a small pool of its own: hands out table prefixes
 * (`ob_<hex>_`) for the stores and business tables of one test, reads box tables, and drops every
 * table under each prefix it handed out (`cleanup`).
 */
export class OutboxPostgresAdmin {
  private readonly prefixes = new Set<string>();
  private readonly pool: Pool;

  constructor(readonly url: string) {
    this.pool = new Pool({ connectionString: url, max: 3, application_name: 'nseq-fault-admin' });
    // An idle connection dropped by a server restart: the next query opens another.
    this.pool.on('error', () => undefined);
  }

  /** A fresh table prefix, registered for `cleanup`. */
  newTablePrefix(): string {
    const prefix = `ob_${randomBytes(5).toString('hex')}_`;
    this.prefixes.add(prefix);
    return prefix;
  }

  async query<Row = Record<string, unknown>>(sql: string, params: unknown[] = []): Promise<Row[]> {
    return (await this.pool.query(sql, params)).rows as Row[];
  }

  /** Every row of a box table, in append order. */
  async rows(tablePrefix: string, box: BoxName = 'outbox_events'): Promise<BoxRow[]> {
    return this.query<BoxRow>(
      `SELECT id, status, attempts, last_error AS "lastError" FROM ${tablePrefix}${box} ORDER BY seq`,
    );
  }

  /** Drops every table whose name starts with a prefix handed out so far; forgets them. */
  async cleanup(): Promise<void> {
    for (const prefix of this.prefixes) {
      const tables = await this.query<{ name: string }>(
        `SELECT tablename AS name FROM pg_tables
         WHERE schemaname = current_schema() AND starts_with(tablename, $1)`,
        [prefix],
      );
      if (tables.length > 0) {
        await this.pool.query(`DROP TABLE IF EXISTS ${tables.map((t) => t.name).join(', ')}`);
      }
    }
    this.prefixes.clear();
  }

  async close(): Promise<void> {
    await this.cleanup();
    await this.pool.end();
  }
}

/** What {@link usePostgres} connected, and the current test's table prefix. */
export interface PostgresFixture {
  readonly admin: OutboxPostgresAdmin;
  /** Fresh for each test; its tables are dropped after it. */
  readonly tablePrefix: string;
}

export interface PostgresFixtureOptions {
  /** Runs after each test, before its tables are dropped: close what uses them. */
  readonly beforeCleanup?: () => Promise<void>;
}

/**
 * Registers, in the calling describe block, an {@link OutboxPostgresAdmin} for its tests, a fresh
 * table prefix per test, and the dropping of each test's tables after it. Call it before the
 * block's own hooks.
 */
export function usePostgres(options: PostgresFixtureOptions = {}): PostgresFixture {
  let admin: OutboxPostgresAdmin | undefined;
  let tablePrefix: string | undefined;
  beforeAll(() => {
    admin = new OutboxPostgresAdmin(SERVERS.postgres.url);
  });
  beforeEach(() => {
    tablePrefix = admin!.newTablePrefix();
  });
  afterEach(async () => {
    try {
      await options.beforeCleanup?.();
    } finally {
      await admin?.cleanup();
      tablePrefix = undefined;
    }
  });
  afterAll(async () => {
    await admin?.close();
  });
  return {
    get admin() {
      if (!admin) throw new Error('usePostgres: no admin outside the block');
      return admin;
    },
    get tablePrefix() {
      if (!tablePrefix) throw new Error('usePostgres: no table prefix outside a test');
      return tablePrefix;
    },
  };
}
