import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { Redis } from 'ioredis';
import type { AmqpConnection } from '@golevelup/nestjs-rabbitmq';
import type { NatsConnection } from './transports/nats/nats.client';
import type { S3Client } from '@aws-sdk/client-s3';
import { SERVERS } from '../../test/support/servers';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import type { PayloadStore } from '../ports/payload-store.port';
import { EncryptingPayloadStore } from './payload/encrypting/encrypting.payload-store';
import { FilesystemPayloadStore } from './payload/filesystem/filesystem.payload-store';
import { RedisPayloadStore } from './payload/redis/redis.payload-store';
import { S3PayloadStore } from './payload/s3/s3.payload-store';
import { postgres } from './presets/postgres.preset';
import { redis } from './presets/redis.preset';
import { MemoryClaimLedger } from './stores/memory/memory.claim-ledger';
import { MemoryResequencerStore } from './stores/memory/memory.resequencer-store';
import { MemorySequenceStore } from './stores/memory/memory.sequence-store';
import { PostgresOutboxStore } from './stores/postgres/postgres.outbox-store';
import { RedisClaimLedger } from './stores/redis/redis.claim-ledger';
import { RedisResequencerStore } from './stores/redis/redis.resequencer-store';
import { RedisSequenceStore } from './stores/redis/redis.sequence-store';
import { SqliteOutboxStore } from './stores/sqlite/sqlite.outbox-store';
import { InMemoryTransport } from './transports/in-memory/in-memory.transport';
import { NatsTransport } from './transports/nats/nats.transport';
import { RabbitMqTransport } from './transports/rabbitmq/rabbitmq.transport';

/**
 * Every adapter that takes an options object refuses a key that is not one of its options, before
 * it opens anything: a misspelt option would otherwise keep its default without a word. None of
 * these needs a server to refuse; the `connect`s given valid options reach the local servers.
 */

const dir = mkdtempSync(join(tmpdir(), 'nseq-option-keys-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** An ioredis client that never connects: the stores' constructors send nothing. */
const lazyRedis = new Redis(SERVERS.redis.url, { lazyConnect: true });
afterAll(() => lazyRedis.disconnect());

const noAmqp = { managedConnection: undefined } as unknown as AmqpConnection;
const inner = { name: 'inner', close: async () => undefined } as unknown as PayloadStore;
const keys = [{ id: 'k1', key: randomBytes(32) }];

interface Closable {
  close?(): Promise<void> | void;
}

/** Builds the adapter with `options` (a literal here stands for a config object or a spread). */
type Build = (options: object) => unknown;

const CASES: ReadonlyArray<[adapter: string, misspelt: string, build: Build, valid: object]> = [
  ['InMemoryTransport', 'maxMessageByte', (o) => new InMemoryTransport(o), { maxDeadLetters: 5 }],
  [
    'RabbitMqTransport',
    'prefetchh',
    (o) => new RabbitMqTransport(noAmqp, o),
    { prefetch: 4, queueType: 'classic' },
  ],
  [
    'RabbitMqTransport.connect',
    'prefetchh',
    (o) => RabbitMqTransport.connect(SERVERS.rabbitmq.url, o),
    { prefetch: 4 },
  ],
  [
    'NatsTransport',
    'ackWait',
    (o) => new NatsTransport({} as NatsConnection, o),
    // Refused before the connection is looked at; valid options are built by connect below.
    undefined as never,
  ],
  [
    'NatsTransport.connect',
    'ackWait',
    (o) => NatsTransport.connect({ servers: SERVERS.nats.url }, o),
    { ackWaitMs: 5_000 },
  ],
  ['MemorySequenceStore', 'encrypt', (o) => new MemorySequenceStore(o), { encryption: { keys } }],
  ['MemoryResequencerStore', 'retention', (o) => new MemoryResequencerStore(o), { retentionMs: 1 }],
  ['MemoryClaimLedger', 'maxEntry', (o) => new MemoryClaimLedger(o), { maxEntries: 10 }],
  [
    'RedisSequenceStore',
    'readAheads',
    (o) => new RedisSequenceStore(lazyRedis, o),
    { readAhead: 8 },
  ],
  [
    'RedisSequenceStore.connect',
    'readAheads',
    (o) => RedisSequenceStore.connect(SERVERS.redis.url, o),
    { readAhead: 8, redis: { lazyConnect: true } },
  ],
  [
    'RedisResequencerStore',
    'retention',
    (o) => new RedisResequencerStore(lazyRedis, o),
    { retentionMs: 60_000 },
  ],
  [
    'RedisResequencerStore.connect',
    'retention',
    (o) => RedisResequencerStore.connect(SERVERS.redis.url, o),
    { retentionMs: 60_000, redis: { lazyConnect: true } },
  ],
  ['RedisClaimLedger', 'prefx', (o) => new RedisClaimLedger(lazyRedis, o), { prefix: 'x' }],
  [
    'RedisClaimLedger.connect',
    'prefx',
    (o) => RedisClaimLedger.connect(SERVERS.redis.url, o),
    { prefix: 'x', redis: { lazyConnect: true } },
  ],
  [
    'RedisPayloadStore',
    'chunkByte',
    (o) => new RedisPayloadStore(lazyRedis, o),
    { chunkBytes: 64 },
  ],
  [
    'RedisPayloadStore.connect',
    'chunkByte',
    (o) => RedisPayloadStore.connect(SERVERS.redis.url, o),
    { chunkBytes: 64, redis: { lazyConnect: true } },
  ],
  [
    'S3PayloadStore',
    'partsInFlite',
    (o) => new S3PayloadStore({} as S3Client, { bucket: 'b', ...o }),
    { partsInFlight: 2 },
  ],
  [
    'S3PayloadStore.connect',
    'regoin',
    (o) => S3PayloadStore.connect({ bucket: 'b', ...o }),
    { region: 'us-east-1', endpoint: 'http://127.0.0.1:1', client: { maxAttempts: 1 } },
  ],
  ['EncryptingPayloadStore', 'key', (o) => new EncryptingPayloadStore(inner, { keys, ...o }), {}],
  [
    'FilesystemPayloadStore',
    'fsynk',
    (o) => new FilesystemPayloadStore({ root: dir, ...o }),
    { fsync: true },
  ],
  [
    'SqliteOutboxStore',
    'tablePrefx',
    (o) => new SqliteOutboxStore(new Database(':memory:', { timeout: 0 }), o),
    { tablePrefix: 'app_' },
  ],
  [
    'SqliteOutboxStore.open',
    'busyTimeout',
    (o) => SqliteOutboxStore.open({ filename: join(dir, 'open.db'), ...o }),
    { busyTimeoutMs: 10, synchronous: 'NORMAL' },
  ],
  [
    'PostgresOutboxStore.connect',
    'tablePrefx',
    (o) => PostgresOutboxStore.connect(SERVERS.postgres.url, o),
    { tablePrefix: 'app_', pool: { max: 1 } },
  ],
  ['redis()', 'prefx', (o) => redis(SERVERS.redis.url, o), { redis: { lazyConnect: true } }],
  [
    'redis() sequenceStore',
    'readAheads',
    (o) => redis(lazyRedis, { sequenceStore: o }),
    { readAhead: 2 },
  ],
  ['postgres()', 'tablePrefx', (o) => postgres(SERVERS.postgres.url, o), { pool: { max: 1 } }],
];

describe('adapter options: an unknown key is refused', () => {
  it.each(CASES)('%s refuses %s', async (_adapter, misspelt, build) => {
    const refused = (async () => build({ [misspelt]: 1 }))();
    await expect(refused).rejects.toThrow(SequenceOptionsError);
    await expect(refused).rejects.toThrow(`${misspelt} is not an option; the options are `);
  });

  it.each(CASES.filter(([, , , valid]) => valid !== undefined))(
    '%s still takes its valid options',
    async (_adapter, _misspelt, build, valid) => {
      const built = (await build(valid)) as Closable;
      await built.close?.();
    },
  );

  it('reports an unknown key with the problems of the values', () => {
    let thrown: unknown;
    try {
      new RedisSequenceStore(lazyRedis, { readAhead: 0, readAheads: 8 } as never);
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(SequenceOptionsError);
    expect((thrown as SequenceOptionsError).problems).toEqual([
      expect.stringMatching(/^readAheads is not an option; the options are prefix, /),
      'readAhead must be an integer >= 1, got 0',
    ]);
  });

  it.each([
    ['InMemoryTransport', () => new InMemoryTransport({ maxMessageBytes: 0, maxDeadLetters: 1.5 })],
    ['MemoryClaimLedger', () => new MemoryClaimLedger({ maxEntries: 0, sweepIntervalMs: -1 })],
    [
      'RedisClaimLedger',
      () => new RedisClaimLedger(lazyRedis, { keyTtlMarginMs: -1, clock: 1 as never }),
    ],
  ])('%s reports every value it refuses in one SequenceOptionsError', (_, build) => {
    let thrown: unknown;
    try {
      build();
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(SequenceOptionsError);
    expect((thrown as SequenceOptionsError).problems).toHaveLength(2);
  });

  describe.each([
    ['MemorySequenceStore', (o: object) => new MemorySequenceStore(o)],
    ['MemoryResequencerStore', (o: object) => new MemoryResequencerStore(o)],
    ['RedisSequenceStore', (o: object) => new RedisSequenceStore(lazyRedis, o)],
    ['RedisResequencerStore', (o: object) => new RedisResequencerStore(lazyRedis, o)],
  ])('%s encryption', (store, build) => {
    // `encryption: process.env.KEY && { keys }` must not store plaintext without a word.
    it.each([null, false, 0, '', 'a key in the wrong place'])('refuses %p, not off', (value) => {
      expect(() => build({ encryption: value })).toThrow(SequenceOptionsError);
      expect(() => build({ encryption: value })).toThrow(
        new RegExp(`${store} encryption[\\s\\S]*must be an object: \\{ keys: `),
      );
    });

    it('is off when left out or undefined', () => {
      expect(() => build({ encryption: undefined })).not.toThrow();
    });
  });

  it('does not look into the options of another library', () => {
    const store = RedisClaimLedger.connect(SERVERS.redis.url, {
      redis: { lazyConnect: true, notAnIoredisOption: 1 } as never,
    });
    return store.close();
  });

  it.each([
    ['RedisSequenceStore', (o: object) => RedisSequenceStore.connect(SERVERS.redis.url, o)],
    ['RedisResequencerStore', (o: object) => RedisResequencerStore.connect(SERVERS.redis.url, o)],
    ['RedisClaimLedger', (o: object) => RedisClaimLedger.connect(SERVERS.redis.url, o)],
    ['RedisPayloadStore', (o: object) => RedisPayloadStore.connect(SERVERS.redis.url, o)],
  ])('%s.connect closes the client it opened for options it then refuses', async (_, connect) => {
    const connectionName = `nseq-refused-${randomBytes(6).toString('hex')}`;
    // A value no store takes, found by the constructor once the client exists.
    expect(() => connect({ keyTtlMarginMs: -1, redis: { connectionName } })).toThrow(
      /keyTtlMarginMs/,
    );
    // Left open, the client would connect within milliseconds on loopback, and stay.
    await new Promise((resolve) => setTimeout(resolve, 300));
    const list = await lazyRedis.client('LIST');
    expect(String(list)).not.toContain(connectionName);
  });

  it('SqliteOutboxStore.open refuses before creating the file', async () => {
    const filename = join(dir, 'refused.db');
    await expect(SqliteOutboxStore.open({ filename, tablePrefx: 'a_' } as never)).rejects.toThrow(
      SequenceOptionsError,
    );
    expect(existsSync(filename)).toBe(false);
  });
});
