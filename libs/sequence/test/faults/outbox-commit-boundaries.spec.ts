import { Client } from 'pg';
import { postgresClient } from '../support/postgres.fixture';
import { eventually } from '../support/sequence-test-app';
import {
  createPostgresOutboxApp,
  FAST_RELAY,
  messageIds,
  orderPlaced,
  type PostgresOutboxApp,
} from './support/outbox-app';
import { describeOnOutboxServers, useOutboxServers } from './support/outbox-servers';
import { QueueCollector } from './support/resequencer-output';

jest.setTimeout(30_000);

/**
 * Guarantees table, row "transaction boundary", for the Outbox on PostgreSQL and RabbitMQ: an
 * event is published if and only if the transaction that recorded it commits, whether the outbox
 * opened that transaction or the application did (`publishEvent(event, { client })` on a raw `pg`
 * connection). Each negative check follows a positive fact: a marker event committed after the
 * one that must not go out has reached the queue, so the relay has looked at the table since.
 */
describeOnOutboxServers(
  'faults: an outbox event goes out exactly when its transaction commits',
  () => {
    const apps: PostgresOutboxApp[] = [];
    const clients: Client[] = [];
    const servers = useOutboxServers({
      beforeCleanup: async () => {
        for (const client of clients.splice(0)) await client.end().catch(() => undefined);
        for (const app of apps.splice(0)) await app.close();
      },
    });
    let channel: string;
    let orders: string;
    let queue: QueueCollector;
    let t: PostgresOutboxApp;

    beforeEach(async () => {
      channel = servers.admin.newChannel();
      orders = `${servers.tablePrefix}orders`;
      queue = new QueueCollector(servers.admin, channel);
      t = await createPostgresOutboxApp({
        tablePrefix: servers.tablePrefix,
        outbox: { routes: { event: () => channel }, outboxEvents: FAST_RELAY },
      });
      apps.push(t);
      await servers.postgres.query(`CREATE TABLE ${orders} (id TEXT PRIMARY KEY)`);
    });

    /** A connection of the application's own, as it would use for its business writes. */
    async function rawClient(): Promise<Client> {
      const client = postgresClient();
      clients.push(client);
      await client.connect();
      return client;
    }

    /**
     * Commits a marker event and waits until it is on the queue (collected), then until the relay
     * is idle and a few more polls went by: whatever was due by then has been published.
     */
    async function markerPublished(id: string): Promise<void> {
      await t.outbox.transaction(async (tx) => tx.publishEvent(orderPlaced(id)));
      await eventually(
        async () => messageIds(await queue.collect()).includes(id),
        `the marker ${id} on the queue`,
      );
      await t.runtime.idle();
      await new Promise((resolve) => setTimeout(resolve, 3 * FAST_RELAY.pollIntervalMs));
      await queue.collect();
    }

    const orderIds = async () =>
      (await servers.postgres.query<{ id: string }>(`SELECT id FROM ${orders} ORDER BY id`)).map(
        (row) => row.id,
      );

    it('a transaction that throws publishes nothing and leaves neither its business row nor its outbox row', async () => {
      const failure = new Error('business rule broken (expected by the test)');
      await expect(
        t.outbox.transaction(async (tx) => {
          await tx.query(`INSERT INTO ${orders} (id) VALUES ($1)`, ['rolled-back']);
          tx.publishEvent(orderPlaced('rolled-back'));
          throw failure;
        }),
      ).rejects.toBe(failure);

      await markerPublished('marker');
      expect(messageIds(queue.messages)).toEqual(['marker']);
      expect(await servers.postgres.rows(servers.tablePrefix)).toEqual([
        { id: 'marker', status: 'COMPLETED', attempts: 1, lastError: null },
      ]);
      expect(await orderIds()).toEqual([]);
    });

    it('publishEvent joined to a raw pg transaction is not published before COMMIT, and is published after it', async () => {
      const client = await rawClient();
      await client.query('BEGIN');
      await client.query(`INSERT INTO ${orders} (id) VALUES ($1)`, ['joined']);
      const id = await t.outbox.publishEvent(orderPlaced('joined'), { client });
      expect(id).toBe('joined');

      // While the application's transaction is open, the row is invisible to the relay.
      await markerPublished('marker');
      expect(messageIds(queue.messages)).toEqual(['marker']);
      expect(await t.outbox.record('outbox_events', id)).toBeUndefined();

      await client.query('COMMIT');
      await eventually(
        async () => messageIds(await queue.collect()).includes(id),
        'the joined event on the queue after COMMIT',
      );
      expect(messageIds(queue.messages)).toEqual(['marker', 'joined']);
      await eventually(
        async () => (await t.outbox.record('outbox_events', id))?.status === 'COMPLETED',
        'the joined event marked completed',
      );
      expect(await orderIds()).toEqual(['joined']);
    });

    describe('woken by PostgreSQL NOTIFY alone (a relay that would poll only once a minute)', () => {
      /** A relay in an app of its own (own pool, own LISTEN connection) that polls every 60 s. */
      async function slowPollingRelay(): Promise<PostgresOutboxApp> {
        const relay = await createPostgresOutboxApp({
          tablePrefix: servers.tablePrefix,
          outbox: {
            migrate: false,
            routes: { event: () => channel },
            outboxEvents: { ...FAST_RELAY, pollIntervalMs: 60_000 },
          },
        });
        apps.push(relay);
        // Its start-up claim has run: anything published from now on was woken by a NOTIFY.
        await relay.runtime.idle();
        return relay;
      }

      beforeEach(async () => {
        // The writers' app keeps its relay off, so only the other app can publish.
        apps.splice(apps.indexOf(t), 1);
        await t.close();
        t = await createPostgresOutboxApp({
          tablePrefix: servers.tablePrefix,
          outbox: {
            routes: { event: () => channel },
            outboxEvents: { enabled: false },
            outboxCommands: { enabled: false },
          },
        });
        apps.push(t);
      });

      it("another instance's commit wakes the relay", async () => {
        await slowPollingRelay();
        await t.outbox.transaction(async (tx) => tx.publishEvent(orderPlaced('notified')));
        await eventually(
          async () => messageIds(await queue.collect()).includes('notified'),
          'the event published by the other instance within 5 s (its next poll is 60 s away)',
        );
        expect(messageIds(queue.messages)).toEqual(['notified']);
      });

      it("the commit of the application's own pg transaction (publishEvent and sendCommand with { client }) wakes the relays", async () => {
        const commands = servers.admin.newChannel();
        const commandQueue = new QueueCollector(servers.admin, commands);
        const both = await createPostgresOutboxApp({
          tablePrefix: servers.tablePrefix,
          outbox: {
            migrate: false,
            routes: { event: () => channel, command: () => commands },
            outboxEvents: { ...FAST_RELAY, pollIntervalMs: 60_000 },
            outboxCommands: { ...FAST_RELAY, pollIntervalMs: 60_000 },
          },
        });
        apps.push(both);
        // Its start-up claims have run: anything published from now on was woken by a NOTIFY.
        await both.runtime.idle();

        const client = await rawClient();
        await client.query('BEGIN');
        await client.query(`INSERT INTO ${orders} (id) VALUES ($1)`, ['own-tx']);
        await t.outbox.publishEvent(orderPlaced('own-tx'), { client });
        const commandId = await t.outbox.sendCommand(
          { id: 'ship-own-tx', type: 'ShipOrder', targetService: 'shipping', payload: {} },
          { client },
        );
        expect(commandId).toBe('ship-own-tx');
        await client.query('COMMIT');

        await eventually(
          async () => messageIds(await queue.collect()).includes('own-tx'),
          'the joined event published within 5 s of COMMIT',
        );
        await eventually(
          async () => messageIds(await commandQueue.collect()).includes('ship-own-tx'),
          'the joined command published within 5 s of COMMIT',
        );
        expect(messageIds(commandQueue.messages)).toEqual(['ship-own-tx']);
        expect(await orderIds()).toEqual(['own-tx']);
      });
    });

    it('publishEvent joined to a raw pg transaction that rolls back is never published', async () => {
      const client = await rawClient();
      await client.query('BEGIN');
      await client.query(`INSERT INTO ${orders} (id) VALUES ($1)`, ['joined']);
      await t.outbox.publishEvent(orderPlaced('joined'), { client });
      await client.query('ROLLBACK');

      await markerPublished('marker');
      expect(messageIds(queue.messages)).toEqual(['marker']);
      expect(await t.outbox.record('outbox_events', 'joined')).toBeUndefined();
      expect(await orderIds()).toEqual([]);
    });
  },
);
