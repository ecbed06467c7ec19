import { Logger } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { SequenceModule } from 'nest-sequence';
import { redis as redisStores } from 'nest-sequence/redis';
import { FreezingProxy } from '../support/freezing-proxy';
import { newPrefix } from '../support/redis.fixture';
import { eventually } from '../support/sequence-test-app';
import { describeWithServer, SERVERS } from '../support/servers';

jest.setTimeout(30_000);

/**
 * A store server that stops answering (frozen: nothing refused, nothing answered) must not hold
 * the application's shutdown: the `redis()` preset's QUIT never gets its reply, so its client is
 * dropped instead, and the stores after it still close.
 */
describeWithServer('redis', 'shutdown: a Redis that stopped answering', () => {
  let proxy: FreezingProxy | undefined;
  afterEach(async () => {
    jest.restoreAllMocks();
    await proxy?.close();
    proxy = undefined;
  });

  it("closes the application, drops the preset's connection, and closes the store set after it", async () => {
    const { hostname, port } = new URL(SERVERS.redis.url);
    proxy = await FreezingProxy.start({ host: hostname, port: Number(port || 6379) });
    const warnings: string[] = [];
    jest.spyOn(Logger.prototype, 'warn').mockImplementation((message: unknown) => {
      warnings.push(String(message));
    });
    let secondClosed = false;
    const second = {
      name: 'second',
      close: async () => {
        secondClosed = true;
      },
    };
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          stores: [
            redisStores(`redis://127.0.0.1:${proxy.port}`, { prefix: newPrefix('nseq-test-quit') }),
            second,
          ],
          shutdownTimeoutMs: 200,
        }),
      ],
    }).compile();
    const app = await moduleRef.init();
    await eventually(() => proxy!.clientsConnected > 0, 'the preset connected');

    proxy.freeze();
    const startedAt = Date.now();
    await app.close();

    expect(Date.now() - startedAt).toBeLessThan(10_000);
    expect(secondClosed).toBe(true);
    // Dropped, not left waiting for QUIT's reply: nothing keeps the process alive.
    await eventually(() => proxy!.clientsConnected === 0, "the preset's connection dropped");
  });
});
