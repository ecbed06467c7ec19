import type { INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  InMemoryTransport,
  OutboxService,
  SequenceModule,
  type OutboxStore,
  type Transport,
} from 'nest-sequence';
import { FaultInjectingTransport } from '../../test/support/sequence-test-app';
import { SqliteOutboxStore } from 'nest-sequence/sqlite';
import { OutboxHealthIndicator, SequenceHealthModule } from 'nest-sequence/health';
import { OutboxRuntime } from '../outbox/outbox.runtime';
import { BOX_NAMES } from '../ports/outbox-store.port';

describe('OutboxHealthIndicator', () => {
  let app: INestApplicationContext | undefined;

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function start(
    store?: OutboxStore,
    transport?: Transport,
  ): Promise<INestApplicationContext> {
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          isGlobal: true,
          transport,
          outbox: {
            store,
            outboxEvents: {
              pollIntervalMs: 20,
              retry: { attempts: 1 },
            },
          },
          tuning: { sweepers: { gaps: { intervalMs: false }, expiry: { intervalMs: false } } },
        }),
        SequenceHealthModule,
      ],
    }).compile();
    moduleRef.useLogger(false);
    app = await moduleRef.init();
    return app;
  }

  it('is up with the embedded SQLite store, and down once a record FAILED (the default threshold)', async () => {
    // A broker that refuses every publish: with one attempt, the record fails at once.
    const transport = new FaultInjectingTransport(new InMemoryTransport());
    transport.beforePublish = () => {
      throw new Error('broker refused');
    };
    const started = await start(undefined, transport);
    const health = started.get(OutboxHealthIndicator);
    const empty = { pending: 0, failed: 0 };
    await expect(health.isHealthy('outbox')).resolves.toEqual({
      outbox: {
        status: 'up',
        store: { name: 'sqlite', status: 'up' },
        boxes: {
          outbox_events: empty,
          outbox_commands: empty,
          inbox_events: empty,
          inbox_commands: empty,
        },
      },
    });
    const outbox = started.get(OutboxService);
    await outbox.transaction(async (tx) =>
      tx.publishEvent({ type: 'T', aggregateType: 'A', aggregateId: '1', payload: 'x'.repeat(10) }),
    );
    const deadline = Date.now() + 5_000;
    while ((await outbox.stats('outbox_events')).pending > 0 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    const result = await health.isHealthy('outbox');
    expect(result.outbox.status).toBe('down');
    expect(result.outbox.boxes?.outbox_events).toEqual({ pending: 0, failed: 1 });
    expect(result.outbox.tripped).toEqual([
      {
        threshold: 'outbox.failed',
        subject: 'outbox_events',
        value: 1,
        limit: 0,
        message: 'outbox_events: 1 failed records, limit 0',
        runbook: 'docs/operations.md#failed-outbox-rows',
      },
    ]);
  });

  it('answers within its timeout, without the counts, when the counts do not come (a slow table)', async () => {
    const store = await SqliteOutboxStore.open({ filename: ':memory:' });
    try {
      const started = await start(store);
      store.stats = () => new Promise(() => undefined);
      const asked = Date.now();

      const result = await started
        .get(OutboxHealthIndicator)
        .isHealthy('outbox', { timeoutMs: 200 });

      expect(Date.now() - asked).toBeLessThan(2_000);
      expect(result).toEqual({ outbox: { status: 'up', store: { name: 'sqlite', status: 'up' } } });
    } finally {
      await app?.close();
      app = undefined;
      await store.close();
    }
  });

  it('starts no new count of a box while one the timeout gave up on still runs', async () => {
    const store = await SqliteOutboxStore.open({ filename: ':memory:' });
    try {
      const started = await start(store);
      const counted: string[] = [];
      store.stats = (box) => {
        counted.push(box);
        return new Promise(() => undefined);
      };
      const indicator = started.get(OutboxHealthIndicator);

      for (let probe = 0; probe < 3; probe++)
        await indicator.isHealthy('outbox', { timeoutMs: 20 });

      // One count per box in all: each later probe waits on the one still running.
      expect(counted.sort()).toEqual([...BOX_NAMES].sort());
    } finally {
      await app?.close();
      app = undefined;
      await store.close();
    }
  });

  it('is up without the counts when counting fails, rather than failing the whole check', async () => {
    const store = await SqliteOutboxStore.open({ filename: ':memory:' });
    try {
      const started = await start(store);
      store.stats = () => Promise.reject(new Error('canceling statement due to statement timeout'));

      const result = await started
        .get(OutboxHealthIndicator)
        .isHealthy('outbox', { timeoutMs: 200 });

      expect(result).toEqual({ outbox: { status: 'up', store: { name: 'sqlite', status: 'up' } } });
    } finally {
      await app?.close();
      app = undefined;
      await store.close();
    }
  });

  describe('in an application that has not started the outbox', () => {
    async function startWithoutOutbox(): Promise<INestApplicationContext> {
      const moduleRef = await Test.createTestingModule({
        imports: [
          SequenceModule.forRoot({
            isGlobal: true,
            tuning: { sweepers: { gaps: { intervalMs: false }, expiry: { intervalMs: false } } },
          }),
          SequenceHealthModule,
        ],
      }).compile();
      moduleRef.useLogger(false);
      app = await moduleRef.init();
      return app;
    }

    it('reports it not started, and starts nothing: no store opened, no relay, no purge', async () => {
      const started = await startWithoutOutbox();
      const runtime = started.get(OutboxRuntime);

      const result = await started.get(OutboxHealthIndicator).isHealthy('outbox');

      expect(result).toEqual({
        outbox: {
          status: 'up',
          store: {
            name: 'outbox store',
            status: 'not-started',
            message: expect.stringContaining('the outbox has not been used'),
          },
        },
      });
      // The embedded store was never opened: no relay, inbox processor or purge runs on it.
      expect(runtime.storeName).toBeUndefined();
    });

    it('checks the store once OutboxService has started the outbox', async () => {
      const started = await startWithoutOutbox();
      await started.get(OutboxService).stats('outbox_events');

      const result = await started.get(OutboxHealthIndicator).isHealthy('outbox');

      expect(result.outbox).toMatchObject({
        status: 'up',
        store: { name: 'sqlite', status: 'up' },
        boxes: { outbox_events: { pending: 0, failed: 0 } },
      });
    });
  });

  it('is down, naming why, when the store no longer answers', async () => {
    const store = await SqliteOutboxStore.open({ filename: ':memory:' });
    const started = await start(store);
    await store.close();
    const result = await started.get(OutboxHealthIndicator).isHealthy('outbox', { timeoutMs: 500 });
    expect(result.outbox.status).toBe('down');
    // Named as when it is up: the adapter's name.
    expect(result.outbox.store).toMatchObject({
      name: 'sqlite',
      status: 'down',
      message: expect.any(String),
    });
  });
});
