#!/usr/bin/env node
/*
 * Creates or upgrades the outbox tables, for deployments that migrate before the application
 * starts (rather than calling store.migrate() at boot):
 *
 *   nest-sequence-outbox-migrate --database-url postgres://user@host/db [--table-prefix app_]
 *
 * The URL may come from DATABASE_URL instead. Prints each migration it applied. Exit codes:
 * - 0: the tables are up to date;
 * - 1: a bad command line, no connection, or a migration that failed (it left nothing of itself);
 * - 3: the connection failed while a migration was being committed, so it may or may not have
 *   been applied: run the command again, which applies only what is missing and says so.
 */
import { newClient } from './postgres-client';
import { migrateOutbox } from './postgres-migrations';
import { PostgresMigrationOutcomeUnknownError } from './postgres-outbox.error';
import { assertTablePrefix, outboxMigrations } from './postgres-outbox.sql';
import { errorMessage, textOf } from '../../../core/errors/caught';

const USAGE =
  'usage: nest-sequence-outbox-migrate --database-url <postgres://...> [--table-prefix <prefix>]\n' +
  '       (the URL may also come from DATABASE_URL)';

/** The tables are up to date. */
export const EXIT_OK = 0;
/** Nothing was done, or the migration that failed was rolled back: see the message. */
export const EXIT_FAILED = 1;
/** A migration's commit was lost with the connection: it may or may not have been applied. */
export const EXIT_OUTCOME_UNKNOWN = 3;

interface CliArguments {
  readonly databaseUrl: string;
  readonly tablePrefix: string;
}

/** What the command line asks for, the usage when it asks for help, or what is wrong with it. */
export function parseArguments(
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
): CliArguments | { readonly help: string } | { readonly error: string } {
  const values: Record<string, string> = {};
  for (let index = 0; index < argv.length; index++) {
    const argument = argv[index];
    if (argument === '--help' || argument === '-h') return { help: USAGE };
    const match = /^--(database-url|table-prefix)(?:=(.*))?$/.exec(argument);
    if (!match) return { error: `unknown argument ${JSON.stringify(argument)}\n${USAGE}` };
    const value = match[2] ?? argv[++index];
    if (value === undefined) return { error: `--${match[1]} needs a value\n${USAGE}` };
    values[match[1]] = value;
  }
  const databaseUrl = values['database-url'] ?? env.DATABASE_URL;
  if (!databaseUrl)
    return { error: `no database: give --database-url or set DATABASE_URL\n${USAGE}` };
  const tablePrefix = values['table-prefix'] ?? '';
  try {
    assertTablePrefix(tablePrefix, '--table-prefix');
  } catch (error) {
    return { error: errorMessage(error) };
  }
  return { databaseUrl, tablePrefix };
}

/** Runs the command; resolves with the exit code. */
export async function runMigrateCli(
  argv: readonly string[],
  env: NodeJS.ProcessEnv,
  out: (line: string) => void,
  err: (line: string) => void,
): Promise<number> {
  const parsed = parseArguments(argv, env);
  if ('help' in parsed) {
    out(parsed.help);
    return EXIT_OK;
  }
  if ('error' in parsed) {
    err(parsed.error);
    return EXIT_FAILED;
  }
  const { databaseUrl, tablePrefix } = parsed;
  let client: ReturnType<typeof newClient> | undefined;
  try {
    // Inside the try: pg refuses a URL it cannot parse (a port out of range) right here.
    client = newClient({
      connectionString: databaseUrl,
      application_name: 'nest-sequence migrate',
      // pg itself waits for ever on a server that accepts the connection and never answers.
      connectionTimeoutMillis: connectTimeoutMs(databaseUrl),
    });
    // A connection dropped between statements surfaces as the failing query's error.
    client.on('error', () => undefined);
    await client.connect();
    const applied = await migrateOutbox(client, { tablePrefix });
    const prefix = JSON.stringify(tablePrefix);
    for (const name of applied) out(`applied ${name} (table prefix ${prefix})`);
    if (applied.length === 0) {
      const latest = outboxMigrations().at(-1)?.name;
      out(`outbox tables up to date (table prefix ${prefix}, at ${latest}): nothing to apply`);
    }
    return EXIT_OK;
  } catch (error) {
    const database = `(database ${redact(databaseUrl)})`;
    if (error instanceof PostgresMigrationOutcomeUnknownError) {
      err(`nest-sequence-outbox-migrate: outcome unknown: ${describe(error)} ${database}`);
      err(
        'nest-sequence-outbox-migrate: run this command again with the same arguments to find ' +
          `out whether ${error.migration} was applied: it applies only what is missing, and ` +
          'prints what it applied',
      );
      return EXIT_OUTCOME_UNKNOWN;
    }
    err(`nest-sequence-outbox-migrate: ${describe(error)} ${database}`);
    return EXIT_FAILED;
  } finally {
    await client?.end().catch(() => undefined);
  }
}

function describe(error: unknown): string {
  if (!(error instanceof Error)) return textOf(error);
  // Node reports a refused connection as an AggregateError with an empty message (IPv4 + IPv6).
  if (error.message) return error.message;
  const code = (error as { code?: string }).code;
  return code ? `could not connect (${code})` : error.name;
}

/** How long connecting may take: the URL's `connect_timeout` (seconds, as libpq's), else 30 s. */
function connectTimeoutMs(url: string): number {
  try {
    const seconds = Number(new URL(url).searchParams.get('connect_timeout') ?? Number.NaN);
    if (Number.isSafeInteger(seconds) && seconds > 0) return seconds * 1000;
  } catch {
    // pg reports a URL it cannot parse itself.
  }
  return CONNECT_TIMEOUT_MS;
}

const CONNECT_TIMEOUT_MS = 30_000;

/**
 * The URL without its secrets, for messages: the password, and any query parameter pg would
 * take one from (`password`, `sslpassword`, `sslkey`, or whatever names a key or a secret).
 */
function redact(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.password) parsed.password = '***';
    for (const name of [...parsed.searchParams.keys()]) {
      if (/pass|secret|key|token/i.test(name)) parsed.searchParams.set(name, '***');
    }
    return parsed.toString();
  } catch {
    return '(an unparsable URL)';
  }
}

if (require.main === module) {
  void runMigrateCli(
    process.argv.slice(2),
    process.env,
    (line) => console.log(line),
    (line) => console.error(line),
  ).then((code) => {
    process.exitCode = code;
  });
}
