import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { OwnedServerProcess, sparePort } from './server-process';

/**
 * A `redis-server` the test owns, on a spare loopback port, so that it can be crashed, paused and
 * restarted without touching the shared server. With `appendOnly`, every write is fsynced to an
 * append-only file before Redis answers (`appendfsync always`), so a restart after SIGKILL keeps
 * everything Redis acknowledged; without it nothing survives a restart.
 */
export class OwnedRedisServer extends OwnedServerProcess {
  private constructor(
    port: number,
    dir: string,
    private readonly appendOnly: boolean,
  ) {
    super(port, dir);
  }

  static async start(options: { appendOnly: boolean }): Promise<OwnedRedisServer> {
    const server = new OwnedRedisServer(
      await sparePort(),
      mkdtempSync(join(tmpdir(), 'nseq-fault-redis-')),
      options.appendOnly,
    );
    await server.restart();
    return server;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  restart(): Promise<void> {
    return this.launch('redis-server', [
      '--port',
      String(this.port),
      '--bind',
      '127.0.0.1',
      '--dir',
      this.dir,
      '--save',
      '',
      '--appendonly',
      this.appendOnly ? 'yes' : 'no',
      '--appendfsync',
      'always',
      '--daemonize',
      'no',
    ]);
  }
}
