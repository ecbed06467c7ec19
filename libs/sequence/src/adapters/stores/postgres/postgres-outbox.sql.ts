import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { BOX_NAMES, type BoxName } from '../../../ports/outbox-store.port';

/** The statements of the store, one file each (`sql/<name>.sql`). */
export type StatementName =
  | 'append'
  | 'append-one'
  | 'receive'
  | 'claim-due'
  | 'claim-heads'
  | 'claim-followers'
  | 'settle-completed'
  | 'delete-completed'
  | 'settle-retry'
  | 'settle-failed'
  | 'relock'
  | 'get'
  | 'list-failed'
  | 'retry-failed'
  | 'discard-failed'
  | 'purge'
  | 'stats'
  | 'lock-partitions';

const STATEMENT_NAMES: readonly StatementName[] = [
  'append',
  'append-one',
  'receive',
  'claim-due',
  'claim-heads',
  'claim-followers',
  'settle-completed',
  'delete-completed',
  'settle-retry',
  'settle-failed',
  'relock',
  'get',
  'list-failed',
  'retry-failed',
  'discard-failed',
  'purge',
  'stats',
  'lock-partitions',
];

/** The statements of one box, with its table name in place. */
export type BoxStatements = Readonly<Record<StatementName, string>>;

/** A schema migration: `sql/migrations/<NNN>_<what>.sql`, applied in name order. */
export interface OutboxMigration {
  /** The file name without `.sql` (`001_outbox_boxes`): what the migrations table records. */
  readonly name: string;
  /** The SQL for one table prefix, ready to run as one multi-statement query. */
  render(tablePrefix: string): string;
}

/** Next to this file in the sources (ts-jest) and in the build (nest-cli assets). */
const SQL_DIRECTORY = join(__dirname, 'sql');
const MIGRATION_DIRECTORY = join(SQL_DIRECTORY, 'migrations');
const MIGRATION_FILE = /^(\d{3}_[a-z0-9_]+)\.sql$/;
const INCLUDE = /^[ \t]*-- @include ([a-z_-]+)[ \t]*$/gm;
const TABLE_PREFIX = /^[A-Za-z_][A-Za-z0-9_]{0,40}$/;

/**
 * Throws when `tablePrefix` could not be put in a table name as it is: the prefix becomes part of
 * unquoted identifiers, so it is checked rather than escaped.
 */
export function assertTablePrefix(
  tablePrefix: string,
  where = 'PostgresOutboxStore options',
): void {
  if (tablePrefix !== '' && !TABLE_PREFIX.test(tablePrefix)) {
    throw new SequenceOptionsError(where, [
      `tablePrefix ${JSON.stringify(tablePrefix)} must be empty or match ${TABLE_PREFIX.source} ` +
        '(a letter or underscore, then up to 40 letters, digits or underscores)',
    ]);
  }
}

/** `<tablePrefix><box>`: the table of one box. */
export function boxTable(tablePrefix: string, box: BoxName): string {
  return `${tablePrefix.toLowerCase()}${box}`;
}

/** The statements that keep track of migrations (`<tablePrefix>outbox_migrations`). */
export interface MigrationStatements {
  /** `migration-start.sql`: lock, create the migrations table, list what was applied. */
  readonly start: string;
  /** `migration-record.sql`: `$1` applied. */
  readonly record: string;
}

let templates: Readonly<Record<StatementName, string>> | undefined;
let migrationTemplates: { start: string; record: string } | undefined;
let migrationList: readonly OutboxMigration[] | undefined;

/**
 * The statements of every box for `tablePrefix`. The files are read once per process (on first
 * use, so that the library loads without them when PostgreSQL is not used).
 */
export function outboxStatements(tablePrefix: string): Readonly<Record<BoxName, BoxStatements>> {
  assertTablePrefix(tablePrefix);
  templates ??= readTemplates();
  const loaded = templates;
  const perBox = {} as Record<BoxName, BoxStatements>;
  for (const box of BOX_NAMES) {
    const table = boxTable(tablePrefix, box);
    const statements = {} as Record<StatementName, string>;
    for (const name of STATEMENT_NAMES) statements[name] = fillTable(loaded[name], table);
    perBox[box] = statements;
  }
  return perBox;
}

/** The migration bookkeeping statements for `tablePrefix`. */
export function migrationStatements(tablePrefix: string): MigrationStatements {
  assertTablePrefix(tablePrefix);
  migrationTemplates ??= {
    start: readStatement('migration-start'),
    record: readStatement('migration-record'),
  };
  return {
    start: fillPrefix(migrationTemplates.start, tablePrefix),
    record: fillPrefix(migrationTemplates.record, tablePrefix),
  };
}

/**
 * The migrations, in the order they apply. In a migration file, `{{table}}` stands for a box
 * table: a file that uses it is applied once per box (all four in the same transaction);
 * `{{prefix}}` stands for the table prefix, for statements that name a table themselves.
 */
export function outboxMigrations(): readonly OutboxMigration[] {
  migrationList ??= readdirSync(MIGRATION_DIRECTORY)
    .map((file) => MIGRATION_FILE.exec(file)?.[1])
    .filter((name): name is string => name !== undefined)
    .sort()
    .map((name) => {
      const template = readFileSync(join(MIGRATION_DIRECTORY, `${name}.sql`), 'utf8');
      return {
        name,
        render: (tablePrefix: string): string => {
          assertTablePrefix(tablePrefix);
          const withPrefix = fillPrefix(template, tablePrefix);
          if (!withPrefix.includes('{{table}}')) return withPrefix;
          return BOX_NAMES.map((box) => fillTable(withPrefix, boxTable(tablePrefix, box))).join(
            '\n',
          );
        },
      };
    });
  if (migrationList.length === 0) {
    throw new Error(`no outbox migrations in ${MIGRATION_DIRECTORY}: the build lost its assets`);
  }
  return migrationList;
}

function readTemplates(): Record<StatementName, string> {
  const read = {} as Record<StatementName, string>;
  // Without their header comments: a statement may run through a caller's executor (Knex's
  // `raw` reads `$1` in a comment as a binding too), and the server need not parse them.
  for (const name of STATEMENT_NAMES) read[name] = withoutComments(readStatement(name));
  return read;
}

function readStatement(name: string): string {
  return readFileSync(join(SQL_DIRECTORY, `${name}.sql`), 'utf8').replace(
    INCLUDE,
    (_line, include: string) => withoutComments(readStatement(`_${include.replace(/^_/, '')}`)),
  );
}

/** An included fragment's lines, without its `--` header: it lands inside another statement. */
function withoutComments(sql: string): string {
  return sql
    .split('\n')
    .filter((line) => !/^\s*--/.test(line) && line.trim() !== '')
    .join('\n');
}

function fillPrefix(template: string, tablePrefix: string): string {
  // As PostgreSQL folds it in the table names: the lock keys made of it must agree.
  return template.replace(/\{\{prefix\}\}/g, tablePrefix.toLowerCase());
}

function fillTable(template: string, table: string): string {
  return template.replace(/\{\{table\}\}/g, table);
}
