import type { Redis } from 'ioredis';
import { RedisPayloadStore, RedisSequenceStore } from 'nest-sequence/redis';
import { FreezingProxy, redisThroughProxy } from '../support/freezing-proxy';
import { OwnedRedisServer } from '../support/processes/owned-redis.server';
import { newPrefix, useRedis } from '../support/redis.fixture';
import { eventually } from '../support/sequence-test-app';
import { describeWithServer } from '../support/servers';
import { createAdminApp, type AdminApp } from './admin-app';

jest.setTimeout(30_000);

/**
 * A store the console cannot reach answers 503 `unavailable` with `Retry-After`, not 500
 * `internal`: a redis-server the test owns, stopped (SIGKILL) under the console's sequence store.
 */
describeWithServer('redis', 'the admin API with its store down', () => {
  let server: OwnedRedisServer | undefined;
  let store: RedisSequenceStore | undefined;
  let admin: AdminApp | undefined;

  afterEach(async () => {
    await admin?.close();
    await store?.close();
    await server?.dispose();
    admin = store = server = undefined;
  });

  it('answers 503 unavailable, with Retry-After, while Redis is down, and 200 once it is back', async () => {
    server = await OwnedRedisServer.start({ appendOnly: false });
    // A command fails after one retry while disconnected, instead of waiting in ioredis's queue
    // for the default 20.
    store = RedisSequenceStore.connect(server.url, {
      prefix: newPrefix(),
      redis: { maxRetriesPerRequest: 1, retryStrategy: () => 50 },
    });
    admin = await createAdminApp({ sequence: { sequence: { store } } });
    expect((await admin.get('sequences')).status).toBe(200);

    await server.stop('SIGKILL');
    const response = await fetch(`${admin.api}/sequences`);
    expect(response.status).toBe(503);
    expect(response.headers.get('retry-after')).toMatch(/^\d+$/);
    expect(await response.json()).toEqual({
      error: 'unavailable',
      message: expect.any(String),
    });

    await server.restart();
    await eventually(
      async () => (await admin!.get('sequences')).status === 200,
      'the console answers again once Redis is back',
    );
  });
});

/**
 * A store that stops answering (a frozen Redis: nothing refused, nothing answered) is unavailable
 * too, once `tuning.storeTimeoutMs` has passed: the console does not wait on it for ever.
 */
describeWithServer('redis', 'the admin API with its store frozen', () => {
  const STORE_TIMEOUT_MS = 500;
  const redis = useRedis({ stem: 'nseq-test-frozen-admin' });
  let proxy: FreezingProxy | undefined;
  let client: Redis | undefined;
  let admin: AdminApp | undefined;

  afterEach(async () => {
    await admin?.close();
    client?.disconnect();
    await proxy?.close();
    admin = client = proxy = undefined;
  });

  it("answers 503 unavailable after claimCheck.readTimeoutMs for a payload's status", async () => {
    ({ proxy, client } = await redisThroughProxy(redis.client.options.port!));
    const store = new RedisPayloadStore(client, { prefix: redis.prefix });
    admin = await createAdminApp({
      sequence: { claimCheck: { store, readTimeoutMs: STORE_TIMEOUT_MS } },
    });
    const { ref } = await store.put(Buffer.from('a payload'), {
      now: Date.now(),
      expiresAt: Date.now() + 60_000,
      published: true,
    });
    expect((await admin.get(`claims/${ref}`)).status).toBe(200);

    proxy.freeze();
    const startedAt = Date.now();
    const response = await fetch(`${admin.api}/claims/${ref}`, {
      signal: AbortSignal.timeout(10_000),
    });
    expect(response.status).toBe(503);
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(STORE_TIMEOUT_MS);
    expect(await response.json()).toEqual({
      error: 'unavailable',
      message: expect.stringMatching(/within 500 ms/),
    });
  });

  it('answers 503 unavailable after tuning.storeTimeoutMs, for the sequences and the overview', async () => {
    ({ proxy, client } = await redisThroughProxy(redis.client.options.port!));
    const store = new RedisSequenceStore(client, { prefix: redis.prefix });
    admin = await createAdminApp({
      sequence: { sequence: { store }, tuning: { storeTimeoutMs: STORE_TIMEOUT_MS } },
    });
    expect((await admin.get('sequences')).status).toBe(200);

    proxy.freeze();
    for (const route of ['sequences', 'overview']) {
      const startedAt = Date.now();
      const response = await fetch(`${admin.api}/${route}`, {
        signal: AbortSignal.timeout(10_000),
      });
      expect({ route, status: response.status }).toEqual({ route, status: 503 });
      expect(Date.now() - startedAt).toBeGreaterThanOrEqual(STORE_TIMEOUT_MS);
      expect(await response.json()).toEqual({
        error: 'unavailable',
        message: expect.stringMatching(/did not answer .* within 500 ms/),
      });
    }
  });
});
