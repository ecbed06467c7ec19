import type { INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { OutboxService, SequenceModule, type OutboxStore } from 'nest-sequence';
import { SqliteOutboxStore } from 'nest-sequence/sqlite';
import { OutboxHealthIndicator, SequenceHealthModule } from 'nest-sequence/health';

describe('OutboxHealthIndicator', () => {
  let app: INestApplicationContext | undefined;

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function start(store?: OutboxStore): Promise<INestApplicationContext> {
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          isGlobal: true,
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

  it('is up with the embedded SQLite store, and counts FAILED records per box', async () => {
    const started = await start();
    const health = started.get(OutboxHealthIndicator);
    await expect(health.isHealthy('outbox')).resolves.toEqual({
      outbox: {
        status: 'up',
        store: { name: 'sqlite', status: 'up' },
        failed: { outbox_events: 0, outbox_commands: 0, inbox_events: 0, inbox_commands: 0 },
      },
    });
    // A route that throws: the record fails at once (no retry can fix it).
    const outbox = started.get(OutboxService);
    await outbox.transaction(async (tx) =>
      tx.publishEvent({ type: 'T', aggregateType: 'A', aggregateId: '1', payload: 'x'.repeat(10) }),
    );
    const deadline = Date.now() + 5_000;
    while ((await outbox.stats('outbox_events')).pending > 0 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    expect((await health.isHealthy('outbox')).outbox.status).toBe('up');
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

  it('is down, naming why, when the store no longer answers', async () => {
    const store = await SqliteOutboxStore.open({ filename: ':memory:' });
    const started = await start(store);
    await store.close();
    const result = await started.get(OutboxHealthIndicator).isHealthy('outbox', { timeoutMs: 500 });
    expect(result.outbox.status).toBe('down');
    expect(result.outbox.store).toMatchObject({ status: 'down', message: expect.any(String) });
  });
});
