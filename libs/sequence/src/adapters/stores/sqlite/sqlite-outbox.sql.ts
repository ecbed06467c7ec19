import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Database, Statement } from 'better-sqlite3';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { BOX_NAMES, type BoxName } from '../../../ports/outbox-store.port';

/** Next to this file in the sources (ts-jest) and in the build (nest-cli assets). */
const SQL_DIRECTORY = join(__dirname, 'sql');
const MIGRATION_FILE = /^(\d{3})_([a-z0-9_]+)\.sql$/;
const TABLE_PLACEHOLDER = /\{\{table\}\}/g;
const TABLE_PREFIX = /^[A-Za-z_][A-Za-z0-9_]{0,40}$/;

/** The statements on one box table, one file each (`sql/<name>.sql`). */
export const BOX_STATEMENTS = [
  'append',
  'get',
  'claim-due',
  'claim-due-ordered',
  'settle-completed',
  'delete-completed',
  'settle-retry',
  'settle-failed',
  'list-failed',
  'retry-failed',
  'discard-failed',
  'purge-completed',
  'stats',
] as const;
export type BoxStatementName = (typeof BOX_STATEMENTS)[number];

/** The statements on the migrations table. */
export const MIGRATION_STATEMENTS = [
  'migrations-table',
  'migration-applied',
  'migration-record',
] as const;
export type MigrationStatementName = (typeof MIGRATION_STATEMENTS)[number];

/** A schema change, applied to each box table once (`sql/migrations/<version>_<name>.sql`). */
export interface SqliteOutboxMigration {
  readonly version: number;
  readonly name: string;
  /** Several statements, `{{table}}` standing for the box table. */
  readonly sql: string;
}

interface SqlFiles {
  readonly statements: Readonly<Record<BoxStatementName | MigrationStatementName, string>>;
  readonly migrations: readonly SqliteOutboxMigration[];
}

let files: SqlFiles | undefined;

/** The SQL files, read once per process. */
export function sqliteOutboxSql(): SqlFiles {
  files ??= {
    statements: Object.fromEntries(
      [...BOX_STATEMENTS, ...MIGRATION_STATEMENTS].map((name) => [
        name,
        readFileSync(join(SQL_DIRECTORY, `${name}.sql`), 'utf8'),
      ]),
    ) as SqlFiles['statements'],
    migrations: readdirSync(join(SQL_DIRECTORY, 'migrations'))
      .map((file) => ({ file, match: MIGRATION_FILE.exec(file) }))
      .filter(({ match }) => match !== null)
      .map(({ file, match }) => ({
        version: Number(match![1]),
        name: match![2],
        sql: readFileSync(join(SQL_DIRECTORY, 'migrations', file), 'utf8'),
      }))
      .sort((a, b) => a.version - b.version),
  };
  return files;
}

/** `sql` with its `{{table}}` placeholders replaced by `table` (a validated identifier). */
export function forTable(sql: string, table: string): string {
  return sql.replace(TABLE_PLACEHOLDER, table);
}

/** Throws {@link SequenceOptionsError} unless `prefix` is usable at the start of a table name. */
export function assertTablePrefix(prefix: string): void {
  if (prefix !== '' && !TABLE_PREFIX.test(prefix)) {
    throw new SequenceOptionsError('SQLite outbox store options', [
      `tablePrefix ${JSON.stringify(prefix)} must be empty or match ${TABLE_PREFIX.source} ` +
        '(letters, digits and _, not starting with a digit, at most 41 characters)',
    ]);
  }
}

/**
 * The prepared statements of one store (one table prefix on one database), prepared on first use
 * (a box table does not exist before `migrate`) and kept for the life of the store. They read
 * integers as numbers even on a database whose default is BigInt.
 */
export class SqliteOutboxStatements {
  private readonly prepared = new Map<string, Statement>();

  constructor(
    readonly database: Database,
    readonly tablePrefix: string,
  ) {
    assertTablePrefix(tablePrefix);
  }

  /** The table of `box` (throws a RangeError for anything that is not a box name). */
  table(box: BoxName): string {
    if (!(BOX_NAMES as readonly string[]).includes(box)) {
      throw new RangeError(
        `unknown outbox box ${JSON.stringify(box)}; expected one of ${BOX_NAMES.join(', ')}`,
      );
    }
    return `${this.tablePrefix}${box}`;
  }

  get migrationsTable(): string {
    return `${this.tablePrefix}outbox_migrations`;
  }

  /** A statement on the table of `box`. */
  box(name: BoxStatementName, box: BoxName): Statement {
    return this.prepare(name, this.table(box));
  }

  /** A statement on the migrations table. */
  migration(name: MigrationStatementName): Statement {
    return this.prepare(name, this.migrationsTable);
  }

  private prepare(name: BoxStatementName | MigrationStatementName, table: string): Statement {
    const key = `${table}\u0000${name}`;
    let statement = this.prepared.get(key);
    if (!statement) {
      // Numbers, whatever the application set with `defaultSafeIntegers` on its Database: the
      // store's integers (seq, times, counts) are all safe, and a record holds no BigInt.
      statement = this.database
        .prepare(forTable(sqliteOutboxSql().statements[name], table))
        .safeIntegers(false);
      this.prepared.set(key, statement);
    }
    return statement;
  }
}
