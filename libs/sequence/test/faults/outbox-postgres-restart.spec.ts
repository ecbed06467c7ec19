import { describeWithServer } from '../support/servers';
import { eventually } from '../support/sequence-test-app';
import {
  createPostgresOutboxApp,
  FAST_RELAY,
  messageIds,
  orderPlaced,
  type PostgresOutboxApp,
} from './support/outbox-app';
import { OwnedPostgresServer } from '../support/processes/owned-postgres.server';
import { RabbitMqAdmin } from '../support/rabbitmq.fixture';
import { QueueCollector } from './support/resequencer-output';

jest.setTimeout(60_000);

const WRITERS = 4;
/** Commits wanted before the restart, and again after it. */
const COMMITS_PER_PHASE = 40;
/** Commits each writer's attempts are spaced by (pacing, so that the outage is not a busy loop). */
const WRITER_PAUSE_MS = 10;

/**
 * What pg and Node say when the server goes away or is not back yet: sessions ended by the
 * shutdown, refused or reset connections, a client whose connection broke mid-transaction.
 */
const OUTAGE =
  /administrator command|shutting down|starting up|ECONNRESET|ECONNREFUSED|EPIPE|not queryable|Connection terminated|timeout exceeded when trying to connect/;

/** `describe` when a PostgreSQL server can be owned here; skipped otherwise (failing under CI). */
function describeWithOwnedPostgres(name: string, body: () => void): void {
  const why = OwnedPostgresServer.unavailable();
  if (why === undefined) {
    describe(name, body);
  } else if (process.env.CI === 'true' || process.env.CI === '1') {
    describe(name, () => {
      it('needs a PostgreSQL server of its own', () => {
        throw new Error(why);
      });
    });
  } else {
    console.warn(`skipping "${name}": ${why}`);
    describe.skip(name, body);
  }
}

/**
 * Guarantees table, row "database restart", for the Outbox: on a PostgreSQL server of the
 * test's own, writers commit events (and a business row each) through `OutboxService.transaction`
 * without pause while the relay publishes them, and the server is restarted (fast shutdown: the
 * sessions are ended, open transactions roll back). The relay and the writers reconnect through
 * the store's pool by themselves. Every commit that resolved reaches the queue; every one that did
 * not was reported to its writer as an error; and a failed commit left either both its business
 * row and its event (the server committed, the reply was lost) or neither.
 */
describeWithServer('rabbitmq', 'faults: PostgreSQL restarted under load', () => {
  describeWithOwnedPostgres('on a PostgreSQL server the test owns', () => {
    let server: OwnedPostgresServer | undefined;
    let admin: RabbitMqAdmin;
    let t: PostgresOutboxApp | undefined;

    beforeAll(async () => {
      [server, admin] = await Promise.all([OwnedPostgresServer.start(), RabbitMqAdmin.connect()]);
    });

    afterAll(async () => {
      await t?.close();
      await admin?.close();
      await server?.dispose();
    });

    it('the relay and the writers reconnect; every committed event is published, every failed commit was reported', async () => {
      const owned = server!;
      const channel = admin.newChannel();
      t = await createPostgresOutboxApp({
        tablePrefix: 'ob_restart_',
        databaseUrl: owned.url,
        outbox: { routes: { event: () => channel }, outboxEvents: FAST_RELAY },
        pool: { max: WRITERS + 2, connectionTimeoutMillis: 2_000 },
      });
      const app = t;
      await app.outbox.transaction((tx) => tx.query('CREATE TABLE orders (id TEXT PRIMARY KEY)'));

      const outcomes = new Map<string, 'committed' | Error>();
      const count = (what: 'committed' | 'failed') =>
        [...outcomes.values()].filter((o) => (o === 'committed') === (what === 'committed')).length;
      let writing = true;
      const writer = async (w: number) => {
        for (let i = 0; writing; i++) {
          const id = `w${w}-${i}`;
          try {
            await app.outbox.transaction(async (tx) => {
              await tx.query('INSERT INTO orders (id) VALUES ($1)', [id]);
              tx.publishEvent(orderPlaced(id));
            });
            outcomes.set(id, 'committed');
          } catch (error) {
            outcomes.set(id, error as Error);
          }
          await new Promise((resolve) => setTimeout(resolve, WRITER_PAUSE_MS));
        }
      };
      const writers = Array.from({ length: WRITERS }, (_, w) => writer(w));

      try {
        await eventually(
          () => count('committed') >= COMMITS_PER_PHASE,
          'commits before the restart',
          20_000,
        );
        await owned.stop();
        const failedAtStop = count('failed');
        await eventually(
          () => count('failed') >= failedAtStop + 2 * WRITERS,
          'writers told that their commits failed while the server is down',
        );
        await owned.restart();
        const committedAtRestart = count('committed');
        await eventually(
          () => count('committed') >= committedAtRestart + COMMITS_PER_PHASE,
          'commits after the restart',
          20_000,
        );
      } finally {
        writing = false;
        await Promise.all(writers);
      }

      const committed = [...outcomes].filter(([, o]) => o === 'committed').map(([id]) => id);
      const failed = [...outcomes].filter(([, o]) => o !== 'committed').map(([id]) => id);
      expect(failed.length).toBeGreaterThanOrEqual(2 * WRITERS);
      // Each failure is the outage's (a commit never fails for another reason here).
      const reasons = new Set(failed.map((id) => (outcomes.get(id) as Error).message));
      expect([...reasons].filter((reason) => !OUTAGE.test(reason))).toEqual([]);

      const queue = new QueueCollector(admin, channel);
      await eventually(
        async () => {
          const published = new Set(messageIds(await queue.collect()));
          return committed.every((id) => published.has(id));
        },
        'every committed event on the queue',
        20_000,
      );
      await eventually(
        async () => (await app.outbox.stats('outbox_events')).pending === 0,
        'no record left PENDING',
      );
      await queue.collect();

      const published = new Set(messageIds(queue.messages));
      const [orders, events] = await app.outbox.transaction(async (tx) => [
        new Set((await tx.query<{ id: string }>('SELECT id FROM orders')).rows.map((r) => r.id)),
        new Set(
          (await tx.query<{ id: string }>(`SELECT id FROM ob_restart_outbox_events`)).rows.map(
            (r) => r.id,
          ),
        ),
      ]);
      // Nothing went out that no writer tried, and what a failed commit left is all or nothing.
      expect([...published].filter((id) => !outcomes.has(id))).toEqual([]);
      expect(committed.filter((id) => !orders.has(id) || !events.has(id))).toEqual([]);
      expect(failed.filter((id) => orders.has(id) !== events.has(id))).toEqual([]);
      expect(failed.filter((id) => events.has(id) && !published.has(id))).toEqual([]);
      expect(await app.outbox.stats('outbox_events')).toMatchObject({ pending: 0, failed: 0 });
      // The store's LISTEN connection (wake-ups from other processes' commits) is back too.
      await eventually(async () => {
        const listening = await app.outbox.transaction(
          async (tx) =>
            (
              await tx.query<{ n: string }>(
                'SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = $1',
                [app.store.listenerApplicationName],
              )
            ).rows[0].n,
        );
        return Number(listening) === 1;
      }, 'the LISTEN connection reconnected');
    });
  });
});
