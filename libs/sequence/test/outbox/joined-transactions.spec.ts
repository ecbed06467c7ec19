import { randomUUID } from 'node:crypto';
import { knex as createKnex, type Knex } from 'knex';
import { Pool, type PoolClient } from 'pg';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { type EventInput } from '../../src/core/outbox-message';
import { describeWithServer, SERVERS } from '../support/servers';
import { postgresPool } from '../support/postgres.fixture';
import { eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, FAST_BOX, type OutboxTestApp } from './outbox-test-app';

const BOXES = ['outbox_events', 'outbox_commands', 'inbox_events', 'inbox_commands'];

/**
 * The samples of docs/outbox-inbox.md "Joining your own transaction" for raw pg and Knex, as
 * written there, on PostgreSQL: the event is published after the caller's commit, never after
 * its rollback.
 */
describeWithServer('postgres', 'Outbox: joining a transaction of your own (docs samples)', () => {
  let admin: Pool;
  let prefix: string;
  let t: OutboxTestApp | undefined;

  beforeAll(() => {
    admin = postgresPool({ max: 2 });
  });

  beforeEach(async () => {
    prefix = `jt${randomUUID().replace(/-/g, '').slice(0, 10)}_`;
    t = await createOutboxTestApp({
      store: PostgresOutboxStore.connect(SERVERS.postgres.url, { tablePrefix: prefix }),
      outboxEvents: FAST_BOX,
    });
    await admin.query(`CREATE TABLE ${prefix}orders (id TEXT PRIMARY KEY)`);
  });

  afterEach(async () => {
    await t?.close();
    t = undefined;
    for (const table of [...BOXES, 'outbox_migrations', 'orders']) {
      await admin.query(`DROP TABLE IF EXISTS ${prefix}${table}`);
    }
  });

  afterAll(async () => {
    await admin.end();
  });

  const placed = (id: string): EventInput => ({
    type: 'OrderPlaced',
    aggregateType: 'Order',
    aggregateId: id,
    payload: { id },
  });
  const published = () =>
    t!.broker
      .peek('events.OrderPlaced')
      .map((m) => (JSON.parse(m.body.toString()) as { aggregateId: string }).aggregateId);
  const orders = async () =>
    (await admin.query<{ id: string }>(`SELECT id FROM ${prefix}orders ORDER BY id`)).rows.map(
      (r) => r.id,
    );

  describe('Knex', () => {
    let knex: Knex;

    beforeEach(() => {
      knex = createKnex({
        client: 'pg',
        connection: SERVERS.postgres.url,
        pool: { min: 0, max: 2 },
      });
    });

    afterEach(async () => {
      await knex.destroy();
    });

    // As in the docs: its bindings are positional `?`, one per occurrence.
    const knexClient = (trx: Knex.Transaction) => ({
      query: (sql: string, values: unknown[] = []) => {
        const bindings: unknown[] = [];
        const text = sql.replace(
          /\$(\d+)/g,
          (_, n: string) => (bindings.push(values[Number(n) - 1]), '?'),
        );
        return trx.raw(text, bindings as Knex.RawBinding[]);
      },
    });

    it('publishes after the commit, and nothing after a rollback', async () => {
      await knex.transaction(async (trx) => {
        await trx(`${prefix}orders`).insert({ id: 'k-1' });
        await t!.outbox.publishEvent(placed('k-1'), { client: knexClient(trx) });
      });
      await expect(
        knex.transaction(async (trx) => {
          await trx(`${prefix}orders`).insert({ id: 'k-2' });
          await t!.outbox.publishEvent(placed('k-2'), { client: knexClient(trx) });
          throw new Error('the business rule says no');
        }),
      ).rejects.toThrow('the business rule says no');

      await eventually(() => published().length === 1, 'the committed event published');
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(published()).toEqual(['k-1']);
      expect(await orders()).toEqual(['k-1']);
      expect(await t!.outbox.stats('outbox_events')).toMatchObject({ pending: 0, failed: 0 });
    });
  });

  describe('raw pg', () => {
    it('publishes after the commit, and nothing after a rollback', async () => {
      const pool = postgresPool({ max: 2 });
      const onLostConnection = jest.fn();
      // As in the docs: the listener is in place from the pool's hand-over.
      const checkOut = () =>
        new Promise<PoolClient>((resolve, reject) =>
          pool.connect((error, client) => {
            if (error || !client) return reject(error ?? new Error('no client'));
            client.on('error', onLostConnection);
            resolve(client);
          }),
        );
      try {
        for (const [id, commit] of [
          ['p-1', true],
          ['p-2', false],
        ] as const) {
          const client = await checkOut();
          try {
            await client.query('BEGIN');
            await client.query(`INSERT INTO ${prefix}orders (id) VALUES ($1)`, [id]);
            await t!.outbox.publishEvent(placed(id), { client });
            await client.query(commit ? 'COMMIT' : 'ROLLBACK');
          } finally {
            client.removeListener('error', onLostConnection);
            client.release();
          }
        }
      } finally {
        await pool.end();
      }

      await eventually(() => published().length === 1, 'the committed event published');
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(published()).toEqual(['p-1']);
      expect(await orders()).toEqual(['p-1']);
      expect(onLostConnection).not.toHaveBeenCalled();
    });
  });
});
