import type { INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  FilesystemPayloadStore,
  MemoryClaimLedger,
  SequenceModule,
  type PayloadStore,
} from 'nest-sequence';
import { RedisPayloadStore } from 'nest-sequence/redis';
import type { ClaimCheckOptions } from '../options/claim-check.options';
import { ClaimCheckHealthIndicator, SequenceHealthModule } from 'nest-sequence/health';

/** A store whose ping behaves as `ping` says: everything else is the real store. */
function withPing(store: PayloadStore, ping: () => Promise<void>): PayloadStore {
  return new Proxy(store, {
    get: (target, property, receiver): unknown =>
      property === 'ping' ? ping : Reflect.get(target, property, receiver),
  });
}

describe('ClaimCheckHealthIndicator', () => {
  let app: INestApplicationContext | undefined;
  let root: string;

  beforeEach(async () => {
    root = await mkdtemp(join(tmpdir(), 'cc-health-'));
  });
  afterEach(async () => {
    await app?.close();
    app = undefined;
    await rm(root, { recursive: true, force: true });
  });

  async function indicator(claimCheck: ClaimCheckOptions): Promise<ClaimCheckHealthIndicator> {
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          isGlobal: true,
          claimCheck,
          tuning: { sweepers: { expiry: { intervalMs: false }, orphans: { intervalMs: false } } },
        }),
        SequenceHealthModule,
      ],
    }).compile();
    moduleRef.useLogger(false);
    app = await moduleRef.init();
    return app.get(ClaimCheckHealthIndicator);
  }

  it('is up when every payload store and the ledger answer, naming each', async () => {
    const health = await indicator({ store: new FilesystemPayloadStore({ root }) });

    await expect(health.isHealthy('claim-check')).resolves.toEqual({
      'claim-check': {
        status: 'up',
        stores: { filesystem: { name: 'filesystem', status: 'up' } },
        ledger: { name: 'memory', status: 'up' },
      },
    });
  });

  it('is down, naming the store and its error, when one of the stores does not answer', async () => {
    // A Redis payload store on a port nobody listens on, as a store tickets may name.
    const unreachable = RedisPayloadStore.connect('redis://127.0.0.1:1', {
      redis: { lazyConnect: true, maxRetriesPerRequest: 0, enableOfflineQueue: false },
    });
    const health = await indicator({
      store: new FilesystemPayloadStore({ root }),
      readStores: [unreachable],
      ledger: new MemoryClaimLedger(),
    });

    const result = await health.isHealthy('claim-check', { timeoutMs: 500 });
    await unreachable.close();

    expect(result['claim-check']).toMatchObject({
      status: 'down',
      stores: {
        filesystem: { status: 'up' },
        redis: { name: 'redis', status: 'down', message: expect.any(String) as unknown },
      },
      ledger: { status: 'up' },
    });
  });

  it('is down when a ping hangs past the timeout', async () => {
    const hanging = withPing(
      new FilesystemPayloadStore({ root }),
      () => new Promise(() => undefined),
    );
    const health = await indicator({ store: hanging });

    const result = await health.isHealthy('claim-check', { timeoutMs: 50 });

    expect(result['claim-check']).toMatchObject({
      status: 'down',
      stores: { filesystem: { status: 'down', message: 'no answer to ping within 50 ms' } },
    });
  });
});
