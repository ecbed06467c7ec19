/**
 * OutboxService.publishEvent(event, { client }) on PostgreSQL, joining the caller's own
 * transaction: a client that is no connection inside a transaction is refused with a typed
 * error, and nothing is written outside that transaction.
 */
import { InMemoryTransport, type InboundMessage } from 'nest-sequence';
import { OutboxForeignTransactionError } from '../../src/core/errors/outbox-foreign-transaction.error';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { describeWithServer, SERVERS } from '../support/servers';
import { postgresPool, usePostgres } from '../support/postgres.fixture';
import { createOutboxTestApp, type OutboxTestApp } from './outbox-test-app';
import type { Pool } from 'pg';

const event = (id: string) => ({
  type: 'PaymentSettled',
  aggregateType: 'Payment',
  aggregateId: id,
  payload: { id },
});

describeWithServer('postgres', 'OutboxService.publishEvent with a client (PostgreSQL)', () => {
  let t: OutboxTestApp | undefined;
  let store: PostgresOutboxStore | undefined;
  let pool: Pool | undefined;
  const pg = usePostgres({
    beforeCleanup: async () => {
      await t?.close();
      t = undefined;
      await store?.close();
      store = undefined;
      await pool?.end();
      pool = undefined;
    },
  });

  async function start(broker: InMemoryTransport) {
    store = PostgresOutboxStore.connect(SERVERS.postgres.url, { tablePrefix: pg.tablePrefix });
    t = await createOutboxTestApp({ store, outboxEvents: { pollIntervalMs: 50 } }, [], { broker });
  }

  it('refuses a missing or unusable client with a typed error, as the SQLite store does', async () => {
    await start(new InMemoryTransport());
    const outbox = t!.outbox;
    for (const client of [undefined, null, {}, 'pg']) {
      await expect(
        outbox.publishEvent(event('p-1'), { client: client as never }),
      ).rejects.toMatchObject({ name: 'OutboxForeignTransactionError', reason: 'no-transaction' });
    }
    await expect(
      outbox.sendCommand(
        { type: 'Refund', targetService: 'payments', payload: {} },
        undefined as never,
      ),
    ).rejects.toBeInstanceOf(OutboxForeignTransactionError);
  });

  it("does not write outside the caller's transaction: a query(text, values) that is a Pool is refused, not autocommitted", async () => {
    const broker = new InMemoryTransport();
    const got: InboundMessage[] = [];
    await broker.subscribe('events.PaymentSettled', async (m) => {
      got.push(m);
      return { action: 'ack' };
    });
    await start(broker);
    pool = postgresPool({ max: 2 });
    const client = await pool.connect();
    try {
      await client.query('BEGIN');
      // A Pool has query(text, values), but runs every statement in a transaction of its own.
      await expect(t!.outbox.publishEvent(event('p-2'), { client: pool })).rejects.toMatchObject({
        reason: 'no-transaction',
      });
      await client.query('ROLLBACK');
    } finally {
      client.release();
    }
    await new Promise((resolve) => setTimeout(resolve, 500));
    await t!.runtime.idle();
    const rows = await pg.admin.query(`SELECT id FROM ${pg.tablePrefix}outbox_events`);
    // The caller rolled back: nothing may be recorded, nothing may be published.
    expect({ rows: rows.length, published: got.length }).toEqual({ rows: 0, published: 0 });
  });
});
