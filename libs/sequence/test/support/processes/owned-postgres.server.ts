import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Client } from 'pg';
import { awaitAnswering, sparePort, stopProcess } from './server-process';

const run = promisify(execFile);

/** Who runs the server: PostgreSQL refuses to run as root, so as root it is `postgres`. */
interface ServerUser {
  readonly uid?: number;
  readonly gid?: number;
}

/**
 * A PostgreSQL server the test owns (initdb in a temporary directory, a spare loopback port),
 * so that it can be stopped and restarted under load without touching the shared server. It runs
 * in the foreground as a child process; `stop()` is a fast shutdown (SIGINT: sessions are ended,
 * committed work is kept), as `pg_ctl -m fast` does. `dispose()` kills it and deletes its files.
 */
export class OwnedPostgresServer {
  private process?: ChildProcess;
  private output = '';

  private constructor(
    private readonly bin: string,
    private readonly user: ServerUser,
    readonly port: number,
    private readonly dir: string,
  ) {}

  /**
   * Why a server cannot be owned here (no PostgreSQL binaries, or root without a `postgres`
   * user), or `undefined` when it can.
   */
  static unavailable(): string | undefined {
    if (!postgresBin()) {
      return 'no PostgreSQL server binaries (initdb, postgres) found; set PG_BIN_DIR';
    }
    if (process.getuid?.() === 0 && serverUser() === undefined) {
      return 'running as root and there is no postgres user to run the server as';
    }
    return undefined;
  }

  /** initdb (trust authentication, no fsync) and a first start; resolves once it answers. */
  static async start(): Promise<OwnedPostgresServer> {
    const bin = postgresBin();
    const user: ServerUser | undefined = process.getuid?.() === 0 ? serverUser() : {};
    if (!bin || !user) throw new Error(`cannot own a PostgreSQL server: ${this.unavailable()}`);
    const dir = mkdtempSync(join(tmpdir(), 'nseq-fault-pg-'));
    const server = new OwnedPostgresServer(bin, user, await sparePort(), dir);
    try {
      if (user.uid !== undefined && user.gid !== undefined) chownSync(dir, user.uid, user.gid);
      await run(
        join(bin, 'initdb'),
        ['-D', server.dataDir, '-A', 'trust', '-U', 'postgres', '-E', 'UTF8', '--no-sync'],
        { ...user },
      );
      await server.restart();
    } catch (error) {
      await server.dispose();
      throw error;
    }
    return server;
  }

  get url(): string {
    return `postgres://postgres@127.0.0.1:${this.port}/postgres`;
  }

  private get dataDir(): string {
    return join(this.dir, 'data');
  }

  /** Starts the server (again) on the same port and data; resolves once it answers queries. */
  async restart(): Promise<void> {
    if (this.process) throw new Error('the owned PostgreSQL server is already running');
    const child = spawn(
      join(this.bin, 'postgres'),
      [
        '-D',
        this.dataDir,
        '-p',
        String(this.port),
        '-k',
        this.dir,
        '-c',
        'listen_addresses=127.0.0.1',
        // A clean shutdown still writes everything out; only an OS crash could lose data.
        '-c',
        'fsync=off',
      ],
      { ...this.user, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    child.stdout?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    child.stderr?.on('data', (chunk: Buffer) => (this.output += chunk.toString()));
    this.process = child;
    // Should the test runner itself exit without disposing of it, the server goes with it.
    const killOnExit = (): void => void child.kill('SIGQUIT');
    process.once('exit', killOnExit);
    child.once('exit', () => process.removeListener('exit', killOnExit));
    try {
      await awaitAnswering(child, () => this.answers(), 20_000, 50);
    } catch (error) {
      this.process = undefined;
      throw new Error(
        `postgres did not start on port ${this.port} (${(error as Error).message}):\n${this.output}`,
      );
    }
  }

  /**
   * Stops the server and waits until it is gone: SIGINT is a fast shutdown (every session is
   * ended, open transactions roll back), SIGKILL a crash.
   */
  async stop(signal: NodeJS.Signals = 'SIGINT'): Promise<void> {
    const child = this.process;
    if (!child) return;
    this.process = undefined;
    await stopProcess(child, signal);
  }

  /** Stops the server (immediately) and deletes its directory; safe to call twice. */
  async dispose(): Promise<void> {
    await this.stop('SIGQUIT');
    rmSync(this.dir, { recursive: true, force: true });
  }

  private async answers(): Promise<boolean> {
    const client = new Client({ connectionString: this.url, connectionTimeoutMillis: 1_000 });
    client.on('error', () => undefined);
    try {
      await client.connect();
      await client.query('SELECT 1');
      return true;
    } catch {
      return false;
    } finally {
      await client.end().catch(() => undefined);
    }
  }
}

/** The directory of initdb and postgres: PG_BIN_DIR, or the newest under /usr/lib/postgresql. */
function postgresBin(): string | undefined {
  const candidates = process.env.PG_BIN_DIR
    ? [process.env.PG_BIN_DIR]
    : existsSync('/usr/lib/postgresql')
      ? readdirSync('/usr/lib/postgresql')
          .sort((a, b) => Number(b) - Number(a))
          .map((version) => join('/usr/lib/postgresql', version, 'bin'))
      : [];
  return candidates.find(
    (dir) => existsSync(join(dir, 'initdb')) && existsSync(join(dir, 'postgres')),
  );
}

function serverUser(): Required<ServerUser> | undefined {
  try {
    const id = (flag: string) => Number(execFileSync('id', [flag, 'postgres']).toString().trim());
    return { uid: id('-u'), gid: id('-g') };
  } catch {
    return undefined;
  }
}
