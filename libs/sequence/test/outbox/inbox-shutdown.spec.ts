import { ShutdownTimeoutError, type OutboxEvent } from 'nest-sequence';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
import { describeWithServer, SERVERS } from '../support/servers';
import { usePostgres } from '../support/postgres.fixture';
import { eventually } from '../support/sequence-test-app';
import {
  createOutboxTestApp,
  FAST_BOX,
  inboxHandler,
  publishInboxEvent,
  type OutboxTestApp,
} from './outbox-test-app';

const SHUTDOWN_TIMEOUT_MS = 300;

describeWithServer('postgres', 'Inbox: a handler still running at shutdown (PostgreSQL)', () => {
  const stores: PostgresOutboxStore[] = [];
  let t: OutboxTestApp | undefined;
  const pg = usePostgres({
    beforeCleanup: async () => {
      await t?.close();
      t = undefined;
      for (const store of stores.splice(0)) await store.close().catch(() => undefined);
    },
  });

  it('is abandoned after shutdownTimeoutMs: the app closes, the record stays due, uncounted', async () => {
    const store = PostgresOutboxStore.connect(SERVERS.postgres.url, {
      tablePrefix: pg.tablePrefix,
    });
    stores.push(store);
    // No handlerTimeoutMs: nothing but the shutdown bounds the call.
    const Handler = inboxHandler({ event: 'TaskCreated', processInTransaction: true });
    t = await createOutboxTestApp({ store, inboxEvents: FAST_BOX }, [Handler], {
      shutdownTimeoutMs: SHUTDOWN_TIMEOUT_MS,
    });
    const reasons: unknown[] = [];
    t.handler(Handler).onCall = (message, { signal }) => {
      if ((message as OutboxEvent).aggregateId !== 'stuck') return Promise.resolve();
      signal.addEventListener('abort', () => reasons.push(signal.reason));
      return new Promise<void>(() => undefined); // an HTTP call without a timeout, say
    };
    const deliver = (aggregateId: string) =>
      publishInboxEvent(
        t!.broker,
        'TaskCreated',
        { aggregateType: 'Task', aggregateId },
        { [MESSAGE_TYPE_HEADER]: 'TaskCreated', 'content-type': 'application/json' },
      );
    const done = await deliver('done');
    await eventually(
      async () => (await store.get('inbox_events', done))?.status === 'COMPLETED',
      'the first record handled',
    );
    const stuck = await deliver('stuck');
    await eventually(() => t!.handler(Handler).calls.length === 2, 'the stuck call');

    const closing = Date.now();
    const closed = await Promise.race([
      t.close().then(() => true),
      new Promise<false>((resolve) => setTimeout(() => resolve(false), 10_000)),
    ]);
    t = undefined;

    expect(closed).toBe(true);
    expect(Date.now() - closing).toBeLessThan(SHUTDOWN_TIMEOUT_MS + 5_000);
    expect(reasons).toEqual([expect.any(ShutdownTimeoutError)]);
    expect(await store.get('inbox_events', stuck)).toMatchObject({
      status: 'PENDING',
      attempts: 0,
    });
    expect((await store.get('inbox_events', done))?.status).toBe('COMPLETED');
  });
});
