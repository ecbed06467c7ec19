import { execFile, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Cluster, type Redis } from 'ioredis';
import {
  sequenceFixture,
  sequenceStoreConformance,
} from '../../../../test/conformance/sequence-store.conformance';
import type { SequenceStore } from '../../../ports/sequence-store.port';
import { RedisKeys } from './redis-keys';
import { RedisSequenceStore } from './redis.sequence-store';

const run = promisify(execFile);
const inCi = process.env.CI === 'true' || process.env.CI === '1';
const MASTERS = 3;

/** A 3-master Redis Cluster of redis-server processes this test owns, on spare loopback ports. */
class LocalCluster {
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
    await Promise.all(this.processes.map(stopProcess));
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
async function spareClusterPort(taken: number[]): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = 20_000 + Math.floor(Math.random() * 20_000);
    if (taken.includes(port)) continue;
    if ((await isFree(port)) && (await isFree(port + 10_000))) return port;
  }
  throw new Error('found no spare loopback port pair for a cluster node');
}

function isFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.once('error', () => resolve(false));
    probe.listen(port, '127.0.0.1', () => probe.close(() => resolve(true)));
  });
}

function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const force = setTimeout(() => child.kill('SIGKILL'), 5_000);
    child.once('exit', () => {
      clearTimeout(force);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

function redisServerInstalled(): boolean {
  return spawnSync('redis-server', ['--version']).status === 0;
}

/** Every key under `prefix`, on every master. */
async function keysUnder(cluster: Cluster, prefix: string): Promise<Array<[Redis, string]>> {
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

const suite = redisServerInstalled() || inCi ? describe : describe.skip;
if (suite === describe.skip) {
  console.warn('skipping the Redis Cluster tests: redis-server is not installed');
}

suite('RedisSequenceStore on a 3-master Redis Cluster', () => {
  const local = new LocalCluster();
  let cluster: Cluster;

  beforeAll(async () => {
    try {
      await local.start();
    } catch (error) {
      throw new Error(`could not start the Redis Cluster: ${String(error)}\n${local.describe()}`);
    }
    cluster = new Cluster(local.ports.map((port) => ({ host: '127.0.0.1', port })));
    await cluster.ping();
  }, 60_000);

  afterAll(async () => {
    await cluster?.quit().catch(() => cluster.disconnect());
    await local.stop();
  }, 30_000);

  const prefixes = new Map<SequenceStore, string>();

  async function create(): Promise<RedisSequenceStore> {
    const prefix = `nseq-test:${randomUUID()}`;
    const store = new RedisSequenceStore(cluster, { prefix });
    prefixes.set(store, prefix);
    return store;
  }

  async function close(store: SequenceStore): Promise<void> {
    await store.close();
    const prefix = prefixes.get(store)!;
    prefixes.delete(store);
    for (const [node, key] of await keysUnder(cluster, prefix)) await node.unlink(key);
    expect(await keysUnder(cluster, prefix)).toEqual([]);
  }

  sequenceStoreConformance('redis on Redis Cluster', { create, close });

  it('spreads sequences over the masters while each sequence stays in one slot', async () => {
    const store = await create();
    try {
      const names = new RedisKeys(prefixes.get(store)!);
      const scope = `cluster.${randomUUID()}`;
      const now = Date.now();
      const masters = new Set<string>();
      for (let index = 0; index < 12; index++) {
        const { fragments, ref } = sequenceFixture(scope, ['a', 'b']);
        await store.accept(fragments[0], {
          now,
          consumerId: 'consumer-a',
          leaseMs: 30_000,
          expiry: { ms: 60_000, strategy: 'fixed' },
          retentionMs: 60_000,
          limits: {
            maxSequenceBytes: 1_000,
            maxFragments: 10,
            maxBufferedBytes: 1_000_000,
            maxOpenSequences: 100,
          },
        });
        const keys = names.sequence(ref);
        const slots = new Set<number>();
        for (const key of [keys.meta, keys.crc, keys.body]) {
          slots.add(Number(await cluster.cluster('KEYSLOT', key)));
        }
        expect(slots.size).toBe(1);
        const [slot] = slots;
        masters.add(await slotOwner(slot));
      }
      expect(masters.size).toBeGreaterThan(1);
      expect(await store.stats(now)).toMatchObject({ openSequences: 12, bufferedBytes: 12 });
    } finally {
      await close(store);
    }
  });

  /** host:port of the master serving a slot. */
  async function slotOwner(slot: number): Promise<string> {
    const ranges = await cluster.cluster('SLOTS');
    const [, , master] = ranges.find(([from, to]) => slot >= from && slot <= to) ?? [];
    return master ? `${master[0]}:${master[1]}` : 'none';
  }
});
