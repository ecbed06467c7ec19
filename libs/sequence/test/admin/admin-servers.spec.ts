import { Injectable, type Type } from '@nestjs/common';
import { SequencedHandler, type ReassembledPayload } from 'nest-sequence';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { RedisSequenceStore } from 'nest-sequence/redis';
import { describeOnRealServers } from '../faults/support/real-servers';
import { usePostgres } from '../support/postgres.fixture';
import { namedTransport, useRabbitMq } from '../support/rabbitmq.fixture';
import { useRedis } from '../support/redis.fixture';
import { bytes, eventually, makeFragments, publishAll } from '../support/sequence-test-app';
import { describeWithServer, SERVERS } from '../support/servers';
import type { SequenceAdminOptions } from 'nest-sequence/admin';
import { createAdminApp, type AdminApp } from './admin-app';

jest.setTimeout(60_000);

/** The channel of the test running now (a fresh queue per test). */
let channel = '';

/** Holds the handler of `held-*` sequences until `release` is called. */
const gate = { release: (): void => undefined };

interface Item {
  readonly sequenceId: string;
  readonly [field: string]: unknown;
}

describeOnRealServers('the admin API over RabbitMQ and Redis', () => {
  const redis = useRedis({ stem: 'nseq-admin' });
  const rabbit = useRabbitMq();
  let admin: AdminApp | undefined;

  afterEach(async () => {
    gate.release();
    await admin?.close();
    admin = undefined;
  });

  /** The app on RabbitMQ and the Redis store, with `Handler` consuming `channel`. */
  async function start(handler: Type, adminOptions: SequenceAdminOptions = {}) {
    const transport = await namedTransport(`nseq-admin-${channel}`);
    const store = RedisSequenceStore.connect(SERVERS.redis.url, { prefix: redis.prefix });
    let app: AdminApp;
    try {
      app = await createAdminApp({
        providers: [handler],
        admin: adminOptions,
        sequence: { transport, consumerId: 'instance-a', sequence: { store } },
      });
    } catch (error) {
      await store.close();
      await transport.close();
      throw error;
    }
    admin = {
      ...app,
      close: async () => {
        await app.close();
        await store.close();
        await transport.close();
      },
    };
    return { transport };
  }

  it('lists an open sequence with its missing positions, and the instance reassembling one', async () => {
    channel = rabbit.admin.newChannel();
    @Injectable()
    class Handler {
      @SequencedHandler({ channel })
      async handle(payload: ReassembledPayload): Promise<void> {
        if (payload.sequenceId.startsWith('held-')) {
          await new Promise<void>((resolve) => (gate.release = resolve));
        }
        await payload.toBuffer();
      }
    }
    const { transport } = await start(Handler);
    const open = makeFragments('study-rmq', bytes(4_000), 1_000);
    await publishAll(transport, channel, [open[0], open[2]]);
    const held = makeFragments('held-rmq', bytes(2_000), 1_000);
    await publishAll(transport, channel, held);

    const list = async () =>
      (await admin!.get<{ items: Item[] }>(`sequences?channel=${channel}`)).body.items;
    await eventually(
      async () => {
        const items = await list();
        return (
          items.some((i) => i.sequenceId === 'study-rmq' && i.bytes === 2_000) &&
          items.some((i) => i.sequenceId === 'held-rmq' && i.leaseHolder !== null)
        );
      },
      'both sequences listed',
      20_000,
    );

    const items = await list();
    expect(items.find((i) => i.sequenceId === 'study-rmq')).toMatchObject({
      channel,
      received: [
        [1, 1],
        [3, 3],
      ],
      missing: [
        [2, 2],
        [4, 4],
      ],
      declaredFragments: 4,
      complete: false,
      leaseHolder: null,
    });
    expect(items.find((i) => i.sequenceId === 'held-rmq')).toMatchObject({
      received: [[1, 2]],
      missing: [],
      receivedCount: 2,
      missingCount: 0,
      complete: true,
      leaseHolder: 'instance-a',
    });
    const one = await admin!.get(`sequences/${channel}/study-rmq`);
    expect(one.body).toMatchObject({
      missing: [
        [2, 2],
        [4, 4],
      ],
    });

    gate.release();
    await eventually(
      async () => !(await list()).some((i) => i.sequenceId === 'held-rmq'),
      'the held sequence completed and left the list',
      20_000,
    );
  });

  it('browses a dead letter of RabbitMQ, replays it once, then says it is gone', async () => {
    channel = rabbit.admin.newChannel();
    @Injectable()
    class Handler {
      @SequencedHandler({ channel })
      async handle(payload: ReassembledPayload): Promise<void> {
        await payload.toBuffer();
      }
    }
    const { transport } = await start(Handler, { mutations: true, replayRatePerSecond: 100 });
    const [fragment] = makeFragments('broken-rmq', bytes(500), 500);
    await transport.publish(
      channel,
      Buffer.from('a body its crc does not match'),
      fragment.headers,
    );

    const letters = async () =>
      (await admin!.get<{ items: { id: string; replays: number }[] }>(`dead-letters/${channel}`))
        .body.items;
    await eventually(async () => (await letters()).length === 1, 'dead-lettered', 20_000);
    const summary = await admin!.get<{ channels: Record<string, unknown>[] }>('dead-letters');
    expect(summary.body.channels).toContainEqual(
      expect.objectContaining({ channel, deadLetterChannel: `${channel}.dlq`, total: 1 }),
    );
    const [{ id }] = await letters();

    const replay = await admin!.post(`dead-letters/${channel}/replay`, { ids: [id] });
    expect(replay.body).toMatchObject({ changed: 1, done: [id] });
    const again = await admin!.post(`dead-letters/${channel}/replay`, { ids: [id] });
    expect(again.body).toMatchObject({ changed: 0, missing: [id] });
    // Still corrupt: it is dead-lettered again, counted as replayed once.
    await eventually(
      async () => (await letters()).some((letter) => letter.replays === 1),
      'dead-lettered again after the replay',
      20_000,
    );
  });
});

describeWithServer('postgres', 'the admin API over the PostgreSQL outbox store', () => {
  const pg = usePostgres({ beforeCleanup: () => admin?.close() ?? Promise.resolve() });
  let admin: AdminApp | undefined;

  beforeEach(async () => {
    admin = await createAdminApp({
      admin: { mutations: true },
      sequence: {
        outbox: {
          store: PostgresOutboxStore.connect(SERVERS.postgres.url, { tablePrefix: pg.tablePrefix }),
          routes: { event: () => ['admin-servers.orders'] },
        },
      },
    });
  });

  // PostgreSQL refuses a NUL in text: no row can have such an id.
  it('finds nothing, without an error, for an id with a NUL character', async () => {
    expect(await admin!.get('find/a%00b')).toEqual({ status: 200, body: { matches: [] } });
  });

  it('answers 400 bad-request for a row id with a NUL character', async () => {
    const answer = await admin!.post('outbox/discard', { ids: ['a\u0000b'] });
    expect(answer).toMatchObject({ status: 400, body: { error: 'bad-request' } });
  });
});
