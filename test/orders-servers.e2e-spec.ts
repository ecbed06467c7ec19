import { randomBytes } from 'node:crypto';
import { MESSAGE_ID_HEADER, MESSAGE_KIND_HEADER, MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
import { Client } from 'pg';
import { describeWithServer, SERVERS } from '../libs/sequence/test/support/servers';
import { postgresClient } from '../libs/sequence/test/support/postgres.fixture';
import { EVERYDAY_SKUS, INITIAL_STOCK, LIMITED_SKU } from '../src/orders/orders.catalogue';
import type { OrderView, StockView } from '../src/orders/orders.model';
import { DEMO_BROKERS } from './support/demo-broker';
import {
  killIfRunning,
  npmScript,
  start,
  terminate,
  type RunningProcess,
} from './support/demo-process';

const ORDERS = 30;

describeWithServer('postgres', 'orders demo on PostgreSQL', () => {
  for (const broker of DEMO_BROKERS) {
    describeWithServer(broker.server, `and ${broker.label.replace(/^on /, '')}`, () => {
      // Tables and queues of this run only: nothing it leaves can meet another run's.
      const run = randomBytes(4).toString('hex');
      const tablePrefix = `orders_e2e_${run}_`;
      const channel = `orders-e2e-${run}.events.OrderPlaced`;
      const env = {
        DATABASE_URL: SERVERS.postgres.url,
        ...broker.env,
        OUTBOX_TABLE_PREFIX: tablePrefix,
        ORDERS_CHANNEL_PREFIX: `orders-e2e-${run}.`,
        ORDERS: String(ORDERS),
        PORT: '0',
        SERVE: '1',
        REDIS_URL: undefined,
        PAYLOAD_DIR: undefined,
        CLAIM_CHECK_ABOVE_BYTES: undefined,
        CLAIM_CHECK_KEY: undefined,
      };
      let database: Client;
      let demo: RunningProcess | undefined;

      const count = async (sql: string, params: unknown[] = []) =>
        Number((await database.query<{ n: string }>(sql, params)).rows[0].n);

      async function cleanUp(): Promise<void> {
        const { rows } = await database.query<{ tablename: string }>(
          'SELECT tablename FROM pg_tables WHERE starts_with(tablename, $1)',
          [tablePrefix],
        );
        for (const { tablename } of rows)
          await database.query(`DROP TABLE IF EXISTS ${tablename} CASCADE`);
        await broker.deleteChannels([channel]);
      }

      beforeAll(async () => {
        database = postgresClient();
        await database.connect();
        await broker.open();
      });

      afterEach(async () => {
        await killIfRunning(demo);
        demo = undefined;
      });

      afterAll(async () => {
        await cleanUp();
        await broker.close();
        await database.end();
      });

      it(`reserves each order once through ${broker.transportName} and PostgreSQL, absorbs duplicates from the broker, publishes nothing for a rolled-back order, and stops on SIGTERM`, async () => {
        demo = start(...npmScript('demo:orders'), env);
        await demo.waitForOutput('all checks passed', 90_000);
        const port = /orders API on http:\/\/localhost:(\d+)\//.exec(demo.output().stdout)?.[1];
        const call = async <Body>(method: 'GET' | 'POST', path: string, body?: unknown) => {
          const response = await fetch(`http://127.0.0.1:${port}${path}`, {
            method,
            headers: body === undefined ? undefined : { 'content-type': 'application/json' },
            body: body === undefined ? undefined : JSON.stringify(body),
          });
          return { status: response.status, body: (await response.json()) as Body };
        };
        const decided = async (id: string) => {
          for (let tries = 0; tries < 500; tries++) {
            const { body } = await call<OrderView>('GET', `/orders/${id}`);
            if (body.status !== 'PLACED') return body;
            await new Promise((resolve) => setTimeout(resolve, 20));
          }
          throw new Error(`order ${id} still PLACED`);
        };

        expect(demo.output().stdout).toContain(
          `orders demo on the ${broker.transportName} transport and the postgres outbox store (tables ${tablePrefix}*)`,
        );
        expect(demo.output().stdout).toContain(`${ORDERS} reserved, 0 rejected`);
        expect(demo.output().stdout).toMatch(/the inbox recorded 1 duplicate/);

        // Rolled back: the order and its event were never committed, so no row holds either.
        const rollback = await call<{ orderId: string }>('POST', '/orders', {
          items: [
            { sku: EVERYDAY_SKUS[0], qty: 1 },
            { sku: 'NO-SUCH-SKU', qty: 1 },
          ],
        });
        expect(rollback.status).toBe(422);
        expect((await call('GET', `/orders/${rollback.body.orderId}`)).status).toBe(404);
        expect(
          await count(`SELECT count(*) AS n FROM ${tablePrefix}orders WHERE id = $1`, [
            rollback.body.orderId,
          ]),
        ).toBe(0);
        expect(
          await count(
            `SELECT count(*) AS n FROM ${tablePrefix}outbox_events WHERE strpos(body, $1) > 0`,
            [rollback.body.orderId],
          ),
        ).toBe(0);

        // A duplicate from another process, through the library's own transport: the
        // relay's record, sent again byte for byte.
        const order = await call<OrderView>('POST', '/orders', {
          items: [{ sku: EVERYDAY_SKUS[1], qty: 2 }],
        });
        expect((await decided(order.body.id)).status).toBe('RESERVED');
        const stockBefore = (await call<StockView>('GET', `/stock/${EVERYDAY_SKUS[1]}`)).body;
        const [record] = (
          await database.query<{ body: string; status: string }>(
            `SELECT body, status FROM ${tablePrefix}outbox_events WHERE id = $1`,
            [order.body.eventId],
          )
        ).rows;
        const transport = await broker.connectTransport();
        try {
          await transport.publish(channel, Buffer.from(record.body), {
            [MESSAGE_ID_HEADER]: order.body.eventId,
            [MESSAGE_KIND_HEADER]: 'event',
            [MESSAGE_TYPE_HEADER]: 'OrderPlaced',
            'content-type': 'application/json',
          });
        } finally {
          await transport.close();
        }
        // An order published after the duplicate, through the same queue, decided: the duplicate
        // was delivered before it.
        const later = await call<OrderView>('POST', '/orders', {
          items: [{ sku: LIMITED_SKU, qty: INITIAL_STOCK[LIMITED_SKU] + 1 }],
        });
        expect((await decided(later.body.id)).status).toBe('REJECTED');

        expect(await terminate(demo)).toMatchObject({
          code: 0,
          signal: null,
        });

        // Once stopped, the broker holds nothing: every copy was acked, none requeued or
        // dead-lettered.
        for (const each of [channel, `${channel}.dlq`]) {
          expect({ channel: each, pending: await broker.pending(each) }).toEqual({
            channel: each,
            pending: 0,
          });
        }
        const [stockAfter] = (
          await database.query<{ available: number; reserved: number }>(
            `SELECT available, reserved FROM ${tablePrefix}stock WHERE sku = $1`,
            [EVERYDAY_SKUS[1]],
          )
        ).rows;
        expect(stockAfter).toEqual({
          available: stockBefore.available,
          reserved: stockBefore.reserved,
        });
        expect(
          (
            await database.query(
              `SELECT status, attempts FROM ${tablePrefix}inbox_events WHERE id = $1`,
              [order.body.eventId],
            )
          ).rows,
        ).toEqual([{ status: 'COMPLETED', attempts: 1 }]);

        // Over the whole run, every order was decided once, and the stock moved by exactly what the
        // reserved orders hold: a second reservation of any order would break one of these.
        const orders = await count(`SELECT count(*) AS n FROM ${tablePrefix}orders`);
        expect(orders).toBe(ORDERS + 3); // the run's, its oversize order, and the two above
        expect(await count(`SELECT count(*) AS n FROM ${tablePrefix}stock_reservations`)).toBe(
          orders,
        );
        expect(
          await count(`SELECT count(*) AS n FROM ${tablePrefix}orders WHERE status = 'PLACED'`),
        ).toBe(0);
        const { rows: stock } = await database.query<{
          sku: string;
          available: number;
          reserved: number;
          held: string | null;
        }>(
          `SELECT s.sku, s.available, s.reserved,
                (SELECT sum(i.qty) FROM ${tablePrefix}order_items i
                   JOIN ${tablePrefix}orders o ON o.id = i.order_id
                  WHERE i.sku = s.sku AND o.status = 'RESERVED') AS held
           FROM ${tablePrefix}stock s ORDER BY s.sku`,
        );
        for (const row of stock) {
          const held = Number(row.held ?? 0);
          expect({ sku: row.sku, available: row.available, reserved: row.reserved }).toEqual({
            sku: row.sku,
            available: INITIAL_STOCK[row.sku] - held,
            reserved: held,
          });
        }
        expect(
          await count(
            `SELECT count(*) AS n FROM ${tablePrefix}outbox_events WHERE status <> 'COMPLETED'`,
          ),
        ).toBe(0);
        expect(
          await count(
            `SELECT count(*) AS n FROM ${tablePrefix}inbox_events WHERE status <> 'COMPLETED'`,
          ),
        ).toBe(0);
      });
    });
  }
});
