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
 * Guarantees table, row "ordered events", on PostgreSQL: two transactions append to one
 * aggregate, the first (T1, the application's raw `pg` transaction) appends A#1 and stays open,
 * the second (T2, `OutboxService.transaction`) appends A#2. With `ordered`, T2 waits on the
 * aggregate's partition lock until T1 commits, so the append order is the commit order and A#1
 * goes out first. Without it, T2 commits first, and the relay, which cannot see T1's uncommitted
 * A#1, publishes A#2 first: the case the lock exists for.
 */
describeOnOutboxServers('faults: two transactions appending to one aggregate at once', () => {
  const apps: PostgresOutboxApp[] = [];
  const clients: Client[] = [];
  const servers = useOutboxServers({
    beforeCleanup: async () => {
      for (const client of clients.splice(0)) await client.end().catch(() => undefined);
      for (const app of apps.splice(0)) await app.close();
    },
  });
  let channel: string;
  let queue: QueueCollector;

  beforeEach(() => {
    channel = servers.admin.newChannel();
    queue = new QueueCollector(servers.admin, channel);
  });

  async function start(ordered: boolean): Promise<PostgresOutboxApp> {
    const t = await createPostgresOutboxApp({
      tablePrefix: servers.tablePrefix,
      outbox: { routes: { event: () => channel }, outboxEvents: { ...FAST_RELAY, ordered } },
    });
    apps.push(t);
    return t;
  }

  /** T1: the application's own transaction on a raw connection, with A#1 appended; left open. */
  async function openT1(t: PostgresOutboxApp): Promise<Client> {
    const client = postgresClient();
    clients.push(client);
    await client.connect();
    await client.query('BEGIN');
    await t.outbox.publishEvent(orderPlaced('A#1', 'A'), { client });
    return client;
  }

  /** T2 through the outbox; `settled` turns true once it resolved (or failed). */
  function startT2(t: PostgresOutboxApp) {
    const state = { settled: false };
    const done = t.outbox
      .transaction(async (tx) => tx.publishEvent(orderPlaced('A#2', 'A')))
      .finally(() => (state.settled = true));
    return { state, done };
  }

  /** Connections of `t`'s pool that wait for an advisory lock (the partition lock). */
  async function waitingOnPartitionLock(t: PostgresOutboxApp): Promise<number> {
    const [row] = await servers.postgres.query<{ waiting: string }>(
      `SELECT count(*) AS waiting FROM pg_stat_activity
       WHERE application_name = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'`,
      [t.applicationName],
    );
    return Number(row.waiting);
  }

  it('with ordered events, T2 waits on the partition lock until T1 commits: A#1 is published before A#2', async () => {
    const t = await start(true);
    const t1 = await openT1(t);
    const t2 = startT2(t);

    await eventually(
      async () => (await waitingOnPartitionLock(t)) === 1,
      'T2 waiting on the partition lock of Order:A',
    );
    expect(t2.state.settled).toBe(false);
    expect(await queue.collect()).toEqual([]);

    await t1.query('COMMIT');
    await t2.done;
    await eventually(async () => (await queue.collect()).length >= 2, 'both events on the queue');
    expect(messageIds(queue.messages)).toEqual(['A#1', 'A#2']);
    await eventually(
      async () =>
        (await servers.postgres.rows(servers.tablePrefix)).every((r) => r.status === 'COMPLETED'),
      'both marked completed',
    );
    expect((await servers.postgres.rows(servers.tablePrefix)).map((r) => r.id)).toEqual([
      'A#1',
      'A#2',
    ]);
  });

  it('without ordered events, T2 commits at once and A#2 is published while T1 is still open', async () => {
    const t = await start(false);
    const t1 = await openT1(t);
    const t2 = startT2(t);

    await t2.done;
    await eventually(
      async () => messageIds(await queue.collect()).includes('A#2'),
      'A#2 on the queue',
    );
    await t1.query('COMMIT');
    await eventually(
      async () => messageIds(await queue.collect()).includes('A#1'),
      'A#1 on the queue',
    );
    expect(messageIds(queue.messages)).toEqual(['A#2', 'A#1']);
  });
});
