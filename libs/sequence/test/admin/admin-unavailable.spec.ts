import { RedisSequenceStore } from 'nest-sequence/redis';
import { OwnedRedisServer } from '../support/processes/owned-redis.server';
import { newPrefix } from '../support/redis.fixture';
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
