import {
  Controller,
  Get,
  type INestApplicationContext,
  type LoggerService,
  type Type,
} from '@nestjs/common';
import { HealthCheck, HealthCheckService } from '@nestjs/terminus';
import { Test } from '@nestjs/testing';
import { randomUUID } from 'node:crypto';
import {
  MemorySequenceStore,
  SEQUENCE_TRANSPORT,
  SequenceModule,
  SequenceOptionsError,
  type SequenceModuleOptions,
  type SequenceStore,
  type Transport,
} from 'nest-sequence';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { RedisSequenceStore } from 'nest-sequence/redis';
import {
  SequenceHealthIndicator,
  SequenceHealthModule,
  type SequenceHealthCheckOptions,
} from 'nest-sequence/health';
import { HEALTH_CALL_SHARED_MS, sharedHealthCall } from './sequence-health.indicator';
import { crc32 } from '../core/checksum';
import { FRAGMENT_OVERHEAD_BYTES, SEQUENCE_OVERHEAD_BYTES } from '../core/completeness';
import { SEQUENCE_STORE } from '../kernel/tokens';
import { describeWithServer, SERVERS } from '../../test/support/servers';
import { redisClient } from '../../test/support/redis.fixture';
import { eventually } from '../../test/support/sequence-test-app';
import { namedConnection, RabbitMqAdmin } from '../../test/support/rabbitmq.fixture';

const silent: LoggerService = {
  log: () => undefined,
  error: () => undefined,
  warn: () => undefined,
};

/** A memory store whose ping behaves as `ping` says: everything else is the real store. */
function storeWithPing(ping: () => Promise<void>): SequenceStore {
  return new Proxy(new MemorySequenceStore(), {
    get: (target, property, receiver): unknown =>
      property === 'ping' ? ping : Reflect.get(target, property, receiver),
  });
}

/** The buffer an idle store with the default `maxBufferedBytes` (1 GiB) reports. */
const IDLE_BUFFER = {
  openSequences: 0,
  bufferedBytes: 0,
  reservedBytes: 0,
  maxBufferedBytes: 1024 ** 3,
  storedPercent: 0,
  reservedPercent: 0,
  usedPercent: 0,
};

describe('SequenceHealthIndicator', () => {
  const apps: INestApplicationContext[] = [];

  async function start(
    options: SequenceModuleOptions = {},
    controllers: Type[] = [],
  ): Promise<INestApplicationContext> {
    const moduleRef = await Test.createTestingModule({
      imports: [SequenceModule.forRoot({ ...options, isGlobal: true }), SequenceHealthModule],
      controllers,
    }).compile();
    moduleRef.useLogger(false);
    const app = await moduleRef.init();
    apps.push(app);
    return app;
  }

  afterEach(async () => {
    await Promise.all(apps.splice(0).map((app) => app.close()));
  });

  it.each([
    [{ timeoutMs: -1 }, /timeoutMs must be an integer >= 1, got -1/],
    [{ timeoutMs: Number.NaN }, /timeoutMs must be an integer >= 1, got NaN/],
    [{ timeoutMs: 2 ** 31 }, /timeoutMs must be at most 2147483647/],
    [{ thresholds: 'false' }, /thresholds must be true or false/],
    [{ timeout: 500 }, /timeout is not an option; the options are timeoutMs, thresholds/],
  ])(
    'refuses isHealthy options %j rather than report every dependency down',
    async (options, says) => {
      const app = await start();
      const checking = app
        .get(SequenceHealthIndicator)
        .isHealthy('sequence', options as SequenceHealthCheckOptions);
      await expect(checking).rejects.toThrow(SequenceOptionsError);
      await expect(checking).rejects.toThrow(says);
    },
  );

  it('is up on the embedded defaults, naming both adapters', async () => {
    const app = await start();

    const result = await app.get(SequenceHealthIndicator).isHealthy('sequence');

    expect(result).toEqual({
      sequence: {
        status: 'up',
        transport: { name: 'in-memory', status: 'up' },
        store: { name: 'memory', status: 'up' },
        buffer: IDLE_BUFFER,
      },
    });
  });

  it('reports the budget stored and reserved against maxBufferedBytes', async () => {
    const app = await start({
      sequence: { maxBufferedBytes: 100_000, maxSequenceBytes: 50_000 },
    });
    const store = app.get<SequenceStore>(SEQUENCE_STORE);
    const body = Buffer.alloc(1_000, 1);
    await store.accept(
      {
        scope: 'scans',
        sequenceId: 'study-1',
        position: 1,
        size: 3,
        last: false,
        crc32: crc32(body),
        bytes: 30_000,
        userHeaders: {},
        body,
      },
      {
        now: Date.now(),
        consumerId: 'c',
        leaseMs: 1_000,
        expiry: { ms: 60_000, strategy: 'fixed' },
        retentionMs: 1_000,
        limits: {
          maxSequenceBytes: 100_000,
          maxFragments: 10,
          maxBufferedBytes: 100_000,
          maxOpenSequences: 10,
        },
      },
    );

    const result = await app.get(SequenceHealthIndicator).isHealthy('sequence');

    const stored = SEQUENCE_OVERHEAD_BYTES + 2 + FRAGMENT_OVERHEAD_BYTES + 1_000;
    const reserved = 2 * FRAGMENT_OVERHEAD_BYTES + 29_000;
    expect(result.sequence.buffer).toEqual({
      openSequences: 1,
      bufferedBytes: stored,
      // Declared and not there yet: 2 fragments and 29,000 bytes.
      reservedBytes: reserved,
      maxBufferedBytes: 100_000,
      storedPercent: Math.round((stored / 100_000) * 1000) / 10,
      reservedPercent: Math.round((reserved / 100_000) * 1000) / 10,
      usedPercent: Math.round(((stored + reserved) / 100_000) * 1000) / 10,
      oldestOpenAgeMs: expect.any(Number),
    });
  });

  it("is down, with the store's error, when the store does not answer its ping", async () => {
    const store = storeWithPing(() => Promise.reject(new Error('ECONNREFUSED 127.0.0.1:6379')));
    const app = await start({
      sequence: { store },
    });

    const result = await app.get(SequenceHealthIndicator).isHealthy('sequence');

    expect(result).toEqual({
      sequence: {
        status: 'down',
        transport: { name: 'in-memory', status: 'up' },
        store: { name: 'memory', status: 'down', message: 'ECONNREFUSED 127.0.0.1:6379' },
      },
    });
  });

  it('answers without the buffer when the store answers its ping but its stats() throws at once', async () => {
    const store = new Proxy(new MemorySequenceStore(), {
      get: (target, property, receiver): unknown =>
        property === 'stats'
          ? () => {
              throw new Error('client is closed');
            }
          : Reflect.get(target, property, receiver),
    });
    const app = await start({ sequence: { store } });

    const result = await app.get(SequenceHealthIndicator).isHealthy('sequence');

    expect(result).toEqual({
      sequence: {
        status: 'up',
        transport: { name: 'in-memory', status: 'up' },
        store: { name: 'memory', status: 'up' },
      },
    });
  });

  it('is down when a ping hangs past the timeout', async () => {
    const store = storeWithPing(() => new Promise<void>(() => undefined));
    const app = await start({
      sequence: { store },
    });

    const result = await app.get(SequenceHealthIndicator).isHealthy('sequence', { timeoutMs: 50 });

    expect(result.sequence.status).toBe('down');
    expect(result.sequence.store).toEqual({
      name: 'memory',
      status: 'down',
      message: 'no answer to ping within 50 ms',
    });
  });

  it('starts no second ping while one that hung is still running: each probe waits on it', async () => {
    let pings = 0;
    let answer: (() => void) | undefined;
    const store = storeWithPing(() => {
      pings++;
      // The first ping hangs until answered; those after it answer at once.
      return answer ? Promise.resolve() : new Promise<void>((resolve) => (answer = resolve));
    });
    const app = await start({ sequence: { store } });
    const indicator = app.get(SequenceHealthIndicator);

    for (let probe = 0; probe < 3; probe++) {
      const result = await indicator.isHealthy('sequence', { timeoutMs: 20 });
      expect(result.sequence.status).toBe('down');
    }
    // A probe every few seconds against a database that stopped answering would otherwise
    // leave a ping (a pool connection, a lock) behind each time.
    expect(pings).toBe(1);

    answer!();
    await new Promise((resolve) => setImmediate(resolve));
    expect((await indicator.isHealthy('sequence', { timeoutMs: 20 })).sequence.status).toBe('up');
    expect(pings).toBe(2);
  });

  it('is down when the transport is closed', async () => {
    const app = await start();
    await app.get<Transport>(SEQUENCE_TRANSPORT).close();

    const result = await app.get(SequenceHealthIndicator).isHealthy('sequence');

    expect(result.sequence).toEqual({
      status: 'down',
      transport: { name: 'in-memory', status: 'down', message: 'in-memory transport is closed' },
      store: { name: 'memory', status: 'up' },
      buffer: IDLE_BUFFER,
    });
  });

  it("fails terminus' health check when down, and passes it when up (as documented)", async () => {
    @Controller('health')
    class HealthController {
      constructor(
        private readonly health: HealthCheckService,
        private readonly sequence: SequenceHealthIndicator,
      ) {}

      @Get()
      @HealthCheck()
      check() {
        return this.health.check([() => this.sequence.isHealthy('sequence')]);
      }
    }
    const healthy = await start({}, [HealthController]);
    const failing = await start(
      {
        sequence: { store: storeWithPing(() => Promise.reject(new Error('gone'))) },
      },
      [HealthController],
    );

    await expect(healthy.get(HealthController).check()).resolves.toMatchObject({ status: 'ok' });
    await expect(failing.get(HealthController).check()).rejects.toMatchObject({
      status: 503,
      response: { status: 'error', error: { sequence: { status: 'down' } } },
    });
  });

  describeWithServer('rabbitmq', 'on RabbitMQ', () => {
    it('is up while connected, and down once the transport is closed', async () => {
      const transport = await RabbitMqTransport.connect(
        SERVERS.rabbitmq.url,
        {},
        { logger: silent },
      );
      try {
        const app = await start({ transport });
        const indicator = app.get(SequenceHealthIndicator);

        const connected = await indicator.isHealthy('sequence');
        await transport.close();
        const closed = await indicator.isHealthy('sequence');

        expect(connected.sequence).toEqual({
          status: 'up',
          transport: { name: 'rabbitmq', status: 'up' },
          store: { name: 'memory', status: 'up' },
          buffer: IDLE_BUFFER,
        });
        expect(closed.sequence).toMatchObject({
          status: 'down',
          transport: { name: 'rabbitmq', status: 'down', message: 'rabbitmq transport is closed' },
        });
      } finally {
        await transport.close();
      }
    });

    it('is down while the transport reconnects after the broker closed its connection, and up again after', async () => {
      const name = `nseq-health-${randomUUID()}`;
      // The client waits 3 s before it reconnects: the window the indicator must report.
      const transport = await RabbitMqTransport.connect(
        SERVERS.rabbitmq.url,
        {},
        namedConnection(name, 3),
      );
      const admin = await RabbitMqAdmin.connect();
      try {
        const app = await start({ transport });
        const indicator = app.get(SequenceHealthIndicator);
        await expect(indicator.isHealthy('sequence')).resolves.toMatchObject({
          sequence: { status: 'up' },
        });

        await admin.closeConnection(name);
        await eventually(
          async () => (await indicator.isHealthy('sequence')).sequence.status === 'down',
          'down while reconnecting',
        );
        expect((await indicator.isHealthy('sequence')).sequence).toEqual({
          status: 'down',
          transport: {
            name: 'rabbitmq',
            status: 'down',
            message: 'not connected to RabbitMQ (reconnecting)',
          },
          store: { name: 'memory', status: 'up' },
          buffer: IDLE_BUFFER,
        });
        await eventually(
          async () => (await indicator.isHealthy('sequence')).sequence.status === 'up',
          'up again once reconnected',
          10_000,
        );
      } finally {
        await transport.close();
        await admin.close();
      }
    });
  });

  describeWithServer('redis', 'on Redis', () => {
    it('is up while the Redis store answers PING, and down (naming why) once it cannot reach Redis', async () => {
      // Fail fast rather than queue commands while disconnected, as docs/message-sequence.md advises.
      const redis = redisClient({
        maxRetriesPerRequest: 1,
        enableOfflineQueue: false,
      });
      const store = new RedisSequenceStore(redis, { prefix: `nseq-health-${randomUUID()}` });
      if (redis.status !== 'ready') await new Promise((resolve) => redis.once('ready', resolve));
      try {
        const app = await start({
          sequence: { store },
        });
        const indicator = app.get(SequenceHealthIndicator);

        const reachable = await indicator.isHealthy('sequence');
        redis.disconnect();
        const unreachable = await indicator.isHealthy('sequence', { timeoutMs: 500 });

        expect(reachable.sequence).toEqual({
          status: 'up',
          transport: { name: 'in-memory', status: 'up' },
          store: { name: 'redis', status: 'up' },
          buffer: IDLE_BUFFER,
        });
        expect(unreachable.sequence).toEqual({
          status: 'down',
          transport: { name: 'in-memory', status: 'up' },
          store: { name: 'redis', status: 'down', message: expect.stringMatching(/writeable/) },
        });
      } finally {
        redis.disconnect();
      }
    });
  });
});

describe('sharedHealthCall', () => {
  afterEach(() => jest.useRealTimers());

  it('shares a call with the probes that come while it runs, for HEALTH_CALL_SHARED_MS at most', async () => {
    jest.useFakeTimers();
    let calls = 0;
    const hung = sharedHealthCall(() => {
      calls++;
      return new Promise<void>(() => undefined);
    });
    const first = hung();
    first.catch(() => undefined);
    expect(hung()).toBe(first);
    expect(calls).toBe(1);

    // A call that hangs (a half-open connection) is not waited on for ever: past the bound,
    // the next probe asks again, and may find the dependency up.
    await jest.advanceTimersByTimeAsync(HEALTH_CALL_SHARED_MS);
    await expect(first).rejects.toThrow(`no answer within ${HEALTH_CALL_SHARED_MS} ms`);
    hung().catch(() => undefined);
    expect(calls).toBe(2);
  });
});
