import { randomUUID } from 'node:crypto';
import { Injectable } from '@nestjs/common';
import { Pool } from 'pg';
import { InboxHandler } from 'nest-sequence';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { describeWithServer, SERVERS } from '../support/servers';
import { postgresPool } from '../support/postgres.fixture';
import { eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, publishInboxEvent, type OutboxTestApp } from './outbox-test-app';

const BOXES = ['outbox_events', 'outbox_commands', 'inbox_events', 'inbox_commands'];
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** The outbox and inbox when PostgreSQL ends their sessions under them. */
describeWithServer(
  'postgres',
  'Outbox and inbox on PostgreSQL: sessions ended by the server',
  () => {
    let admin: Pool;
    let prefix: string;
    let t: OutboxTestApp | undefined;
    const stores: PostgresOutboxStore[] = [];

    beforeAll(() => {
      admin = postgresPool({ max: 2 });
    });

    beforeEach(() => {
      prefix = `sf${randomUUID().replace(/-/g, '').slice(0, 10)}_`;
    });

    afterEach(async () => {
      await t?.close();
      t = undefined;
      for (const store of stores.splice(0)) await store.close().catch(() => undefined);
      for (const table of [...BOXES, 'outbox_migrations']) {
        await admin.query(`DROP TABLE IF EXISTS ${prefix}${table}`);
      }
    });

    afterAll(async () => {
      await admin.end();
    });

    /** A store whose sessions carry this test's application_name; closed after the test. */
    function connect(pool: Record<string, unknown> = {}): PostgresOutboxStore {
      const store = PostgresOutboxStore.connect(SERVERS.postgres.url, {
        tablePrefix: prefix,
        pool: { application_name: prefix, ...pool },
      });
      stores.push(store);
      return store;
    }

    async function row(box: string, id: string) {
      const { rows } = await admin.query<{ status: string; attempts: number }>(
        `SELECT status, attempts FROM ${prefix}${box} WHERE id = $1`,
        [id],
      );
      return rows[0];
    }

    /**
     * An app whose PaymentSettled handler ends its own claim's session (a failover, a terminated
     * backend) on the calls `ends` picks, then returns; and one such message, its id returned.
     */
    async function endingSessions(ends: (call: number) => boolean, attempts: number) {
      const handler = { calls: 0 };
      @Injectable()
      class Mailer {
        @InboxHandler({ event: 'PaymentSettled' })
        async handle(): Promise<void> {
          if (!ends(++handler.calls)) return;
          await admin.query(
            `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = $1 AND state = 'idle in transaction'`,
            [prefix],
          );
          await sleep(100);
        }
      }
      t = await createOutboxTestApp(
        {
          store: connect(),
          inboxEvents: {
            pollIntervalMs: 100,
            retry: { attempts, baseDelayMs: 10, maxDelayMs: 40 },
          },
        },
        [Mailer],
      );
      const id = await publishInboxEvent(t.broker, 'PaymentSettled', {
        aggregateType: 'Payment',
        aggregateId: 'p-1',
        payload: {},
      });
      return { handler, id };
    }

    it('a handler that succeeded while its claim’s session was ended is not charged an attempt', async () => {
      const { handler, id } = await endingSessions((call) => call === 1, 1);

      await eventually(
        async () => ['COMPLETED', 'FAILED'].includes((await row('inbox_events', id))?.status ?? ''),
        'the record settled',
        15_000,
      );
      // Handed out again, uncounted, rather than FAILED after its one attempt.
      expect(await row('inbox_events', id)).toEqual({ status: 'COMPLETED', attempts: 1 });
      expect(handler.calls).toBe(2);
    });

    it('a handler whose session ends after every call counts every second end: FAILED, not run for ever', async () => {
      const { handler, id } = await endingSessions(() => true, 3);

      await eventually(
        async () => (await row('inbox_events', id))?.status === 'FAILED',
        'the record FAILED',
        20_000,
      );
      expect(await row('inbox_events', id)).toEqual({ status: 'FAILED', attempts: 3 });
      expect(handler.calls).toBe(6);
      const { rows } = await admin.query<{ last_error: string }>(
        `SELECT last_error FROM ${prefix}inbox_events WHERE id = $1`,
        [id],
      );
      expect(rows[0].last_error).toContain('session ended after the handler');
    });

    it('an inbox handler outlasting the server’s idle_in_transaction_session_timeout runs once', async () => {
      let calls = 0;
      @Injectable()
      class Slow {
        @InboxHandler({ event: 'PaymentSettled' })
        async handle(): Promise<void> {
          calls++;
          await sleep(700); // the claim's transaction idles meanwhile
        }
      }
      t = await createOutboxTestApp(
        {
          store: connect({ idle_in_transaction_session_timeout: 300 }),
          inboxEvents: { pollIntervalMs: 100, retry: { baseDelayMs: 10, maxDelayMs: 40 } },
        },
        [Slow],
      );
      const id = await publishInboxEvent(t.broker, 'PaymentSettled', {
        aggregateType: 'Payment',
        aggregateId: 'p-3',
        payload: {},
      });

      await eventually(
        async () => (await row('inbox_events', id))?.status === 'COMPLETED' || calls > 1,
        'completed, or handled again',
        10_000,
      );
      await sleep(300);
      expect({ ...(await row('inbox_events', id)), calls }).toEqual({
        status: 'COMPLETED',
        attempts: 1,
        calls: 1,
      });
    });

    it('a claim outlasting the server’s idle_in_transaction_session_timeout still settles: published once', async () => {
      t = await createOutboxTestApp({
        store: connect({ idle_in_transaction_session_timeout: 300 }),
        outboxEvents: { pollIntervalMs: 200, retry: { baseDelayMs: 10, maxDelayMs: 40 } },
      });
      // Each confirm takes longer than the timeout: the claim's transaction idles meanwhile.
      t.transport.beforePublish = () => sleep(700);
      const id = await t.outbox.transaction(async (tx) =>
        tx.publishEvent({
          type: 'OrderPlaced',
          aggregateType: 'Order',
          aggregateId: 'o-1',
          payload: {},
        }),
      );
      const copies = () => t!.broker.peek('events.OrderPlaced').length;

      await eventually(
        async () => copies() > 1 || (await row('outbox_events', id))?.status === 'COMPLETED',
        'completed, or published again',
        10_000,
      );
      await sleep(500);
      expect({ ...(await row('outbox_events', id)), copies: copies() }).toEqual({
        status: 'COMPLETED',
        attempts: 1,
        copies: 1,
      });
    });
  },
);
