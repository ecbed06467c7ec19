/*
 * A throwaway Redis Cluster for tests: redis-server processes the test owns (started, clustered
 * and stopped by it), so that the Redis adapters can prove they run unchanged on a cluster
 * without any shared cluster on the machine.
 */
import { execFile, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import type { Cluster, Redis } from 'ioredis';
import { isFree, terminateProcess } from './server-process';

const run = promisify(execFile);
/** Masters of a {@link LocalCluster}; no replicas. */
export const MASTERS = 3;

/** A 3-master Redis Cluster of redis-server processes this test owns, on spare loopback ports. */
export class LocalCluster {
  readonly ports: number[] = [];
  private readonly processes: ChildProcess[] = [];
  private directory?: string;
  private readonly output: string[] = [];

  /** Should the test process end without afterAll (a killed run), the servers go with it. */
  private readonly killOnExit = () => this.processes.forEach((server) => server.kill('SIGKILL'));

  async start(): Promise<void> {
    process.once('exit', this.killOnExit);
    const directory = (this.directory = mkdtempSync(join(tmpdir(), 'nseq-cluster-')));
    for (let node = 0; node < MASTERS; node++) this.ports.push(await spareClusterPort(this.ports));
    for (const port of this.ports) {
      const server = spawn(
        'redis-server',
        [
          '--port',
          String(port),
          '--bind',
          '127.0.0.1',
          '--cluster-enabled',
          'yes',
          '--cluster-config-file',
          `nodes-${port}.conf`,
          '--dir',
          directory,
          '--save',
          '',
          '--appendonly',
          'no',
          '--daemonize',
          'no',
        ],
        { stdio: ['ignore', 'pipe', 'pipe'] },
      );
      server.stdout?.on('data', (chunk: Buffer) => this.log(port, chunk));
      server.stderr?.on('data', (chunk: Buffer) => this.log(port, chunk));
      this.processes.push(server);
    }
    for (const port of this.ports) await this.until(port, ['ping'], (reply) => reply === 'PONG');
    await run(
      'redis-cli',
      [
        '--cluster',
        'create',
        ...this.ports.map((port) => `127.0.0.1:${port}`),
        '--cluster-replicas',
        '0',
        '--cluster-yes',
      ],
      { timeout: 30_000 },
    );
    for (const port of this.ports) {
      await this.until(port, ['cluster', 'info'], (reply) => reply.includes('cluster_state:ok'));
    }
  }

  async stop(): Promise<void> {
    await Promise.all(this.processes.map((server) => terminateProcess(server)));
    process.removeListener('exit', this.killOnExit);
    if (this.directory) rmSync(this.directory, { recursive: true, force: true });
  }

  /** For the failure message when the cluster does not come up. */
  describe(): string {
    return this.output.join('').slice(-4_000);
  }

  private log(port: number, chunk: Buffer): void {
    if (this.output.length < 200) this.output.push(`[${port}] ${chunk.toString()}`);
  }

  private async until(port: number, command: string[], ok: (reply: string) => boolean) {
    const deadline = Date.now() + 20_000;
    for (;;) {
      const reply = await run('redis-cli', ['-p', String(port), ...command], {
        timeout: 5_000,
      }).then(
        ({ stdout }) => stdout.trim(),
        (error: Error) => error.message,
      );
      if (ok(reply)) return;
      if (Date.now() > deadline) {
        throw new Error(`redis-server on ${port}: ${command.join(' ')} answered ${reply}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}

/** A free port whose cluster bus port (+10000) is free too. */
export async function spareClusterPort(taken: number[]): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = 20_000 + Math.floor(Math.random() * 20_000);
    if (taken.includes(port)) continue;
    if ((await isFree(port)) && (await isFree(port + 10_000))) return port;
  }
  throw new Error('found no spare loopback port pair for a cluster node');
}

/** Whether `redis-server` can be run from the PATH. */
export function redisServerInstalled(): boolean {
  return spawnSync('redis-server', ['--version']).status === 0;
}

/** Every key under `prefix`, on every master. */
export async function keysUnder(cluster: Cluster, prefix: string): Promise<Array<[Redis, string]>> {
  const found: Array<[Redis, string]> = [];
  for (const node of cluster.nodes('master')) {
    let cursor = '0';
    do {
      const [next, batch] = await node.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
      for (const key of batch) found.push([node, key]);
      cursor = next;
    } while (cursor !== '0');
  }
  return found;
}
