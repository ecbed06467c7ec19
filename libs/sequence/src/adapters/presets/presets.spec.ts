import { randomUUID } from 'node:crypto';
import { Injectable } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import {
  MemorySequenceStore,
  OutboxService,
  SequencedHandler,
  SequenceModule,
  SplitterService,
  type ReassembledPayload,
} from 'nest-sequence';
import { postgres } from 'nest-sequence/postgres';
import { redis } from 'nest-sequence/redis';
import { eventually } from '../../../test/support/sequence-test-app';
import { SEQUENCE_STORE } from '../../kernel/tokens';
import { describeWithServer, SERVERS } from '../../../test/support/servers';
import { postgresPool } from '../../../test/support/postgres.fixture';
import { redisClient } from '../../../test/support/redis.fixture';

/** Keys under `prefix`. */
async function keysUnder(client: Redis, prefix: string): Promise<string[]> {
  return client.keys(`${prefix}:*`);
}

/** The server's clients, a line each (`CLIENT LIST`). */
async function clientList(client: Redis): Promise<string[]> {
  return String(await client.client('LIST'))
    .split('\n')
    .filter(Boolean);
}

describeWithServer('redis', 'redis(): every Redis store over one connection', () => {
  let admin: Redis;
  beforeAll(() => (admin = redisClient()));
  afterAll(() => admin.quit());

  it('wires the four stores on the client it is given, under one prefix, and leaves the client open', async () => {
    const client = redisClient();
    const prefix = `nseq-preset-${randomUUID()}`;
    const set = redis(client, { prefix });

    expect(set.name).toBe('redis');
    expect(
      [set.sequenceStore, set.resequencerStore, set.claimLedger, set.payloadStore].map(
        (store) => store?.name,
      ),
    ).toEqual(['redis', 'redis', 'redis', 'redis']);
    await set.payloadStore!.put(Buffer.from('parked'), {
      now: Date.now(),
      expiresAt: Date.now() + 60_000,
      published: true,
    });
    expect((await keysUnder(admin, prefix)).length).toBeGreaterThan(0);
    const clientsBefore = (await clientList(admin)).length;

    await set.close();

    // The caller's client: still open, and no connection of the preset's own was made.
    await expect(client.ping()).resolves.toBe('PONG');
    expect(await clientList(admin)).toHaveLength(clientsBefore);
    await admin.del(...(await keysUnder(admin, prefix)));
    await client.quit();
  });

  it('opens a client of its own from a URL, and closes it with the set', async () => {
    const prefix = `nseq-preset-${randomUUID()}`;
    const name = `nseq-preset-${randomUUID().slice(0, 8)}`;
    const set = redis(SERVERS.redis.url, { prefix, redis: { connectionName: name } });
    await set.claimLedger!.ping();
    const named = async () =>
      (await clientList(admin)).filter((line) => line.includes(`name=${name} `));
    expect(await named()).toHaveLength(1);

    await set.close();

    await eventually(async () => (await named()).length === 0, 'the preset client closed');
  });

  it('closes the client it opened when a store refuses its options', async () => {
    const name = `nseq-preset-${randomUUID().slice(0, 8)}`;
    const named = async () =>
      (await clientList(admin)).filter((line) => line.includes(`name=${name} `));

    expect(() =>
      redis(SERVERS.redis.url, {
        redis: { connectionName: name },
        sequenceStore: { keyTtlMarginMs: 0 },
      }),
    ).toThrow(/keyTtlMarginMs must be an integer >= 1/);
    // Had it stayed open, the client would have connected by now and stayed.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(await named()).toEqual([]);
  });

  it.each([
    ['sequenceStore', 'encryption'],
    ['resequencerStore', 'encryption'],
    ['sequenceStore', 'prefix'],
    ['resequencerStore', 'prefix'],
    ['claimLedger', 'prefix'],
    ['payloadStore', 'prefix'],
    ['claimLedger', 'unsafeSocketTricks'],
  ])('refuses %s.%s, which redis() sets for every store, rather than drop it', (group, key) => {
    const client = redisClient({ lazyConnect: true });
    const value = key === 'encryption' ? { keys: [] } : key === 'prefix' ? 'mine' : true;
    // As a forRootAsync factory or plain JavaScript can pass it, past the types.
    const options = { [group]: { [key]: value } } as Parameters<typeof redis>[1];
    expect(() => redis(client, options)).toThrow(
      new RegExp(`${group}\\.${key}: give it to redis\\(\\) itself`),
    );
    client.disconnect();
  });

  it('leaves payloads to another store with payloadStore: false', () => {
    const set = redis(redisClient({ lazyConnect: true }), {
      payloadStore: false,
    });
    expect(set.payloadStore).toBeUndefined();
    return set.close();
  });

  it('is what the module reassembles in, unless the sequence store is given', async () => {
    const prefix = `nseq-preset-${randomUUID()}`;
    const received: string[] = [];
    @Injectable()
    class Reader {
      @SequencedHandler({ channel: 'preset.scans' })
      async read(payload: ReassembledPayload): Promise<void> {
        received.push((await payload.toBuffer()).toString());
      }
    }
    const boot = async (store?: MemorySequenceStore) => {
      const moduleRef = await Test.createTestingModule({
        imports: [
          SequenceModule.forRoot({
            stores: redis(SERVERS.redis.url, { prefix }),
            sequence: { store, fragmentBytes: 4 },
          }),
        ],
        providers: [Reader],
      }).compile();
      moduleRef.useLogger(false);
      return moduleRef.init();
    };

    const app = await boot();
    expect(app.get(SEQUENCE_STORE)).toMatchObject({ name: 'redis' });
    await app.get(SplitterService).send('preset.scans', Buffer.from('twelve bytes'));
    await eventually(() => received.length === 1, 'the sequence reassembled');
    expect(received).toEqual(['twelve bytes']);
    await app.close();

    const own = new MemorySequenceStore();
    const second = await boot(own);
    expect(second.get(SEQUENCE_STORE)).toBe(own);
    await second.close();
    const left = await keysUnder(admin, prefix);
    if (left.length > 0) await admin.del(...left);
  });
});

describeWithServer('postgres', 'postgres(): the outbox store', () => {
  it('is the outbox the module records in, and its pool closes with the set', async () => {
    const tablePrefix = `preset_${randomUUID().replaceAll('-', '').slice(0, 12)}_`;
    const applicationName = `nseq-preset-${randomUUID().slice(0, 8)}`;
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          stores: postgres(SERVERS.postgres.url, {
            tablePrefix,
            pool: { application_name: applicationName },
          }),
          outbox: {},
        }),
      ],
    }).compile();
    moduleRef.useLogger(false);
    const app = await moduleRef.init();
    const admin = postgresPool({ max: 1 });
    try {
      await app.get(OutboxService).transaction(async (tx) =>
        tx.publishEvent({
          type: 'Checked',
          aggregateType: 'Preset',
          aggregateId: '1',
          payload: {},
        }),
      );
      const { rows } = await admin.query<{ count: string }>(
        `SELECT count(*) FROM ${tablePrefix}outbox_events`,
      );
      expect(Number(rows[0].count)).toBe(1);

      await app.close();
      // A backend leaves pg_stat_activity a moment after its client hung up.
      await eventually(async () => {
        const { rowCount } = await admin.query(
          'SELECT 1 FROM pg_stat_activity WHERE application_name = $1',
          [applicationName],
        );
        return rowCount === 0;
      }, 'the pool ended');
    } finally {
      for (const box of ['outbox_events', 'outbox_commands', 'inbox_events', 'inbox_commands']) {
        await admin.query(`DROP TABLE IF EXISTS ${tablePrefix}${box}`);
      }
      await admin
        .query(`DROP TABLE IF EXISTS ${tablePrefix}schema_migrations`)
        .catch(() => undefined);
      await admin.end();
    }
  });
});
