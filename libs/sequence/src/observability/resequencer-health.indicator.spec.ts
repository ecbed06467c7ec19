import type { INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { MemoryResequencerStore, SequenceModule, type ResequencerStore } from 'nest-sequence';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { ResequencerHealthIndicator, SequenceHealthModule } from 'nest-sequence/health';

describe('ResequencerHealthIndicator', () => {
  let app: INestApplicationContext | undefined;

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function indicator(store?: ResequencerStore): Promise<ResequencerHealthIndicator> {
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          isGlobal: true,
          resequencer: { store },
          tuning: { sweepers: { gaps: { intervalMs: false }, expiry: { intervalMs: false } } },
        }),
        SequenceHealthModule,
      ],
    }).compile();
    moduleRef.useLogger(false);
    app = await moduleRef.init();
    return app.get(ResequencerHealthIndicator);
  }

  it('is up with the store that answers (the embedded memory store)', async () => {
    const health = await indicator(new MemoryResequencerStore());
    await expect(health.isHealthy('resequencer')).resolves.toEqual({
      resequencer: { status: 'up', store: { name: 'memory', status: 'up' } },
    });
  });

  it('is down, naming the store and why, when the store does not answer', async () => {
    // Nothing listens on port 1: the client fails at once and never reconnects.
    const client = new Redis({
      port: 1,
      lazyConnect: true,
      retryStrategy: () => null,
      maxRetriesPerRequest: 0,
      // Refused at once, without a connection attempt that would keep the process alive ~2 s.
      enableOfflineQueue: false,
    });
    const health = await indicator(new RedisResequencerStore(client));
    const result = await health.isHealthy('resequencer', { timeoutMs: 500 });
    expect(result.resequencer.status).toBe('down');
    expect(result.resequencer.store).toMatchObject({
      name: 'redis',
      status: 'down',
      message: expect.any(String),
    });
    client.disconnect();
  });
});
