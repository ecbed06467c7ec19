import { createServer, type AddressInfo, type Socket } from 'node:net';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { Client, Pool } from 'pg';
import { SERVERS, describeWithServer } from '../../../../test/support/servers';
import { postgresClient, postgresPool } from '../../../../test/support/postgres.fixture';
import {
  postgresStatementProxy,
  type PostgresStatementProxy,
  type StatementFate,
} from '../../../../test/support/postgres-statement-proxy';
import { PostgresMigrationOutcomeUnknownError, PostgresOutboxError } from './postgres-outbox.error';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { BOX_NAMES } from '../../../ports/outbox-store.port';
import { migrateOutbox } from './postgres-migrations';
import { outboxMigrations } from './postgres-outbox.sql';

const URL = SERVERS.postgres.url;
const REPOSITORY = join(__dirname, '../../../../../..');
const CLI = join(__dirname, 'migrate.cli.ts');

function uniquePrefix(): string {
  return `m${randomBytes(5).toString('hex')}_`;
}

interface CliRun {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** The CLI as a user runs it, in a process of its own (from the sources, through ts-node). */
function runCli(args: string[], env: NodeJS.ProcessEnv = {}): Promise<CliRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      ['-r', 'ts-node/register/transpile-only', '-r', 'tsconfig-paths/register', CLI, ...args],
      { cwd: REPOSITORY, env: { PATH: process.env.PATH, ...env } },
    );
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

describeWithServer('postgres', 'migrateOutbox', () => {
  let pool: Pool;
  let tablePrefix: string;

  beforeEach(() => {
    pool = postgresPool({ max: 6 });
    tablePrefix = uniquePrefix();
  });

  afterEach(async () => {
    const tables = [...BOX_NAMES, 'outbox_migrations'].map((name) => `${tablePrefix}${name}`);
    await pool.query(`DROP TABLE IF EXISTS ${tables.join(', ')}`);
    await pool.end();
  });

  async function recorded(): Promise<string[]> {
    const { rows } = await pool.query<{ name: string }>(
      `SELECT name FROM ${tablePrefix}outbox_migrations ORDER BY name`,
    );
    return rows.map((row) => row.name);
  }

  async function tablesOfPrefix(): Promise<string[]> {
    const { rows } = await pool.query<{ tablename: string }>(
      'SELECT tablename FROM pg_tables WHERE starts_with(tablename, $1) ORDER BY tablename',
      [tablePrefix],
    );
    return rows.map((row) => row.tablename);
  }

  it('applies every migration once, recording each in the migrations table', async () => {
    const all = outboxMigrations().map((migration) => migration.name);
    expect(all[0]).toBe('001_outbox_boxes');

    await expect(migrateOutbox(pool, { tablePrefix })).resolves.toEqual(all);
    await expect(recorded()).resolves.toEqual(all);
    expect(await tablesOfPrefix()).toEqual(
      [...BOX_NAMES, 'outbox_migrations'].map((name) => `${tablePrefix}${name}`).sort(),
    );
  });

  it('is idempotent: a second run applies nothing and keeps the rows', async () => {
    await migrateOutbox(pool, { tablePrefix });
    await pool.query(
      `INSERT INTO ${tablePrefix}outbox_events (id, kind, type, body, created_at)
       VALUES ('kept', 'event', 'T', '{}', now())`,
    );
    await expect(migrateOutbox(pool, { tablePrefix })).resolves.toEqual([]);
    const { rows } = await pool.query(`SELECT id FROM ${tablePrefix}outbox_events`);
    expect(rows).toEqual([{ id: 'kept' }]);
  });

  it('lets five concurrent runs apply each migration exactly once', async () => {
    const runs = await Promise.all(
      Array.from({ length: 5 }, () => migrateOutbox(pool, { tablePrefix })),
    );
    const names = outboxMigrations().map((migration) => migration.name);
    expect(runs.flat().sort()).toEqual(names);
    expect(runs.filter((applied) => applied.length > 0)).toHaveLength(1);
    await expect(recorded()).resolves.toEqual(names);
  });

  it('runs on a connected client as well as on a pool', async () => {
    const client = postgresClient();
    await client.connect();
    try {
      await expect(migrateOutbox(client, { tablePrefix })).resolves.toContain('001_outbox_boxes');
      await expect(migrateOutbox(client, { tablePrefix })).resolves.toEqual([]);
    } finally {
      await client.end();
    }
  });

  it('keeps prefixes apart', async () => {
    const other = uniquePrefix();
    try {
      await migrateOutbox(pool, { tablePrefix });
      await expect(migrateOutbox(pool, { tablePrefix: other })).resolves.toContain(
        '001_outbox_boxes',
      );
    } finally {
      const tables = [...BOX_NAMES, 'outbox_migrations'].map((name) => `${other}${name}`);
      await pool.query(`DROP TABLE IF EXISTS ${tables.join(', ')}`);
    }
  });

  it('refuses a prefix that is not a plain identifier, before touching the database', async () => {
    await expect(migrateOutbox(pool, { tablePrefix: 'x; DROP TABLE y' })).rejects.toBeInstanceOf(
      SequenceOptionsError,
    );
    expect(pool.totalCount).toBe(0);
  });

  it('rolls a failing migration back whole, naming it', async () => {
    // A table in the way of the first box table: the migration fails on it.
    await pool.query(`CREATE TABLE ${tablePrefix}outbox_commands (unrelated INT)`);
    const failure = migrateOutbox(pool, { tablePrefix });
    await expect(failure).rejects.toBeInstanceOf(PostgresOutboxError);
    await expect(failure).rejects.toThrow(/001_outbox_boxes.*rolled back/);
    // outbox_events, created before the failing statement, and the migrations table (created
    // in the same transaction) were rolled back with it.
    expect(await tablesOfPrefix()).toEqual([`${tablePrefix}outbox_commands`]);
  });

  describe('when the connection fails', () => {
    let proxy: PostgresStatementProxy | undefined;

    afterEach(async () => {
      await proxy?.close();
      proxy = undefined;
    });

    /** Migrates on a client of its own through a proxy that drops the connection at `fate`. */
    async function migrateThrough(fate: (sql: string) => StatementFate): Promise<unknown> {
      proxy = await postgresStatementProxy(URL, fate);
      const client = new Client({ connectionString: proxy.url });
      client.on('error', () => undefined);
      await client.connect();
      try {
        await migrateOutbox(client, { tablePrefix });
        throw new Error('the migration resolved, though its connection was dropped');
      } catch (error) {
        return error;
      } finally {
        await client.end().catch(() => undefined);
      }
    }

    it('says the outcome is unknown, not rolled back, when the connection fails at COMMIT', async () => {
      // PostgreSQL runs the COMMIT; the connection closes before its answer reaches the client.
      const error = await migrateThrough((sql) => (sql === 'COMMIT' ? 'drop-after' : 'pass'));
      expect(proxy!.dropped).toEqual(['COMMIT', '(its answer)']);
      expect(error).toBeInstanceOf(PostgresMigrationOutcomeUnknownError);
      expect(error).toBeInstanceOf(PostgresOutboxError);
      expect(error).toMatchObject({ migration: '001_outbox_boxes', tablePrefix });
      expect((error as Error).message).toMatch(
        /001_outbox_boxes.*may or may not have been applied/,
      );
      expect((error as Error).message).not.toMatch(/rolled back/);
      // It was in fact applied, which "rolled back" would have denied; migrating again says so.
      await expect(recorded()).resolves.toEqual(['001_outbox_boxes']);
      await expect(migrateOutbox(pool, { tablePrefix })).resolves.toEqual([]);
    });

    it('says the outcome is unknown when the connection fails as COMMIT is sent', async () => {
      // This time PostgreSQL never receives it and rolls back; the client cannot tell the two apart.
      const error = await migrateThrough((sql) => (sql === 'COMMIT' ? 'drop-before' : 'pass'));
      expect(error).toBeInstanceOf(PostgresMigrationOutcomeUnknownError);
      await expect(migrateOutbox(pool, { tablePrefix })).resolves.toEqual(['001_outbox_boxes']);
    });

    it('still says rolled back when the connection fails before COMMIT', async () => {
      const error = await migrateThrough((sql) =>
        sql.includes(`INSERT INTO ${tablePrefix}outbox_migrations`) ? 'drop-before' : 'pass',
      );
      expect(proxy!.dropped).toHaveLength(1);
      expect(error).toBeInstanceOf(PostgresOutboxError);
      expect(error).not.toBeInstanceOf(PostgresMigrationOutcomeUnknownError);
      expect((error as Error).message).toMatch(/001_outbox_boxes.*rolled back/);
      expect(await tablesOfPrefix()).toEqual([]);
    });
  });

  describe('the migrate CLI', () => {
    it('applies the migrations, then finds nothing new to apply', async () => {
      const first = await runCli(['--database-url', URL, '--table-prefix', tablePrefix]);
      expect(first).toMatchObject({ code: 0, stderr: '' });
      expect(first.stdout).toContain('applied 001_outbox_boxes');
      await expect(recorded()).resolves.toContain('001_outbox_boxes');

      const second = await runCli([`--database-url=${URL}`, `--table-prefix=${tablePrefix}`]);
      expect(second).toMatchObject({ code: 0, stderr: '' });
      expect(second.stdout).not.toContain('applied');
      expect(second.stdout).toContain('up to date');
    });

    it('reads the database URL from DATABASE_URL', async () => {
      const run = await runCli(['--table-prefix', tablePrefix], { DATABASE_URL: URL });
      expect(run.code).toBe(0);
      await expect(recorded()).resolves.toContain('001_outbox_boxes');
    });

    it('exits 1 saying why when it cannot connect, without printing the password', async () => {
      const run = await runCli(['--database-url', 'postgres://someone:secret@127.0.0.1:1/none']);
      expect(run.code).toBe(1);
      expect(run.stderr).toMatch(/ECONNREFUSED|could not connect/);
      expect(run.stderr).not.toContain('secret');
    });

    it('prints no password given as a query parameter of the URL', async () => {
      const run = await runCli([
        '--database-url',
        'postgres://someone@127.0.0.1:1/none?password=secret&sslpassword=hidden&application_name=x',
      ]);
      expect(run.code).toBe(1);
      expect(run.stderr).not.toMatch(/secret|hidden/);
      expect(run.stderr).toContain('application_name=x');
    });

    it("exits 1 when a server takes the connection and never answers, at the URL's connect_timeout", async () => {
      const sockets: Socket[] = [];
      const silent = createServer((socket) => sockets.push(socket));
      await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
      try {
        const { port } = silent.address() as AddressInfo;
        const run = await runCli([
          '--database-url',
          `postgres://someone@127.0.0.1:${port}/none?connect_timeout=1`,
        ]);
        expect(run.code).toBe(1);
        expect(run.stderr).toMatch(/timeout/i);
      } finally {
        for (const socket of sockets) socket.destroy();
        await new Promise((resolve) => silent.close(resolve));
      }
    });

    it('exits 1 with the usage when no database is given', async () => {
      const run = await runCli([]);
      expect(run.code).toBe(1);
      expect(run.stderr).toContain('--database-url');
    });

    it('exits 1 saying why, in one line, for a URL pg cannot parse, without printing the password', async () => {
      // A port typo: pg refuses such a URL when the client is made, before it connects.
      const run = await runCli([
        '--database-url',
        'postgres://someone:secret@127.0.0.1:99999/none',
      ]);
      expect(run.code).toBe(1);
      expect(run.stderr).toMatch(/^nest-sequence-outbox-migrate: /);
      expect(run.stderr).not.toContain('secret');
    });

    it('exits 3 saying the outcome is unknown, and how to find it out, when the connection fails at COMMIT', async () => {
      const proxy = await postgresStatementProxy(URL, (sql) =>
        sql === 'COMMIT' ? 'drop-after' : 'pass',
      );
      try {
        const run = await runCli(['--database-url', proxy.url, '--table-prefix', tablePrefix]);
        expect(proxy.dropped).toEqual(['COMMIT', '(its answer)']);
        expect(run.code).toBe(3);
        expect(run.stdout).toBe('');
        expect(run.stderr).toMatch(/^nest-sequence-outbox-migrate: outcome unknown: /);
        expect(run.stderr).toContain('001_outbox_boxes');
        expect(run.stderr).toContain('may or may not have been applied');
        expect(run.stderr).toContain('run this command again with the same arguments');
        expect(run.stderr).not.toMatch(/rolled back/);
      } finally {
        await proxy.close();
      }
      // Run again, it tells: applied (by the lost commit), nothing left to do.
      const again = await runCli(['--database-url', URL, '--table-prefix', tablePrefix]);
      expect(again).toMatchObject({ code: 0, stderr: '' });
      expect(again.stdout).toContain('up to date');
    });

    it('prints the usage on stdout and exits 0 for --help', async () => {
      const run = await runCli(['--help']);
      expect(run).toMatchObject({ code: 0, stderr: '' });
      expect(run.stdout).toContain('usage: nest-sequence-outbox-migrate');
    });
  });
});
