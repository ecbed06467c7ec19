import type { INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import {
  MemoryResequencerStore,
  ResequencerService,
  SequenceModule,
  type ResequencerStore,
} from 'nest-sequence';
import { RedisResequencerStore } from 'nest-sequence/redis';
import { ResequencerHealthIndicator, SequenceHealthModule } from 'nest-sequence/health';

describe('ResequencerHealthIndicator', () => {
  let app: INestApplicationContext | undefined;

  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  async function indicator(
    store?: ResequencerStore,
    limits: { maxBufferedTotal?: number; maxBufferedBytesTotal?: number } = {},
  ): Promise<ResequencerHealthIndicator> {
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          isGlobal: true,
          resequencer: { store, ...limits },
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
      resequencer: {
        status: 'up',
        store: { name: 'memory', status: 'up' },
        buffers: {},
        gaps: {},
      },
    });
  });

  it("reports each resequencer's buffered events and bytes against its bounds", async () => {
    const health = await indicator(new MemoryResequencerStore(), {
      maxBufferedTotal: 50,
      maxBufferedBytesTotal: 4_096,
    });
    const orders = app!
      .get(ResequencerService)
      .create({ channel: 'orders', gap: { timeoutMs: 60_000, policy: 'alert' } }, () => undefined);
    const headers = { 'x-resequence-key': 'K', 'x-resequence-seq': 2 };
    await orders.receive({ body: Buffer.alloc(100), headers });
    const result = await health.isHealthy('resequencer');
    expect(result.resequencer.buffers).toEqual({
      // The body, the headers' names and values, and 64 bytes.
      orders: { events: 1, maxEvents: 50, bytes: 100 + 17 + 17 + 64, maxBytes: 4_096 },
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
