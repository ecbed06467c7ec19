import { Injectable } from '@nestjs/common';
import {
  HandlerTimeoutError,
  InboxHandler,
  OutboxService,
  type InboxContext,
  type OutboxEvent,
  type OutboxStore,
} from 'nest-sequence';
import { PostgresOutboxStore } from 'nest-sequence/postgres';
import { MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
import type { BoxOptions } from '../../src/options/outbox.options';
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

const TIMEOUT_MS = 30;
const TaskCreated = inboxHandler({
  event: 'TaskCreated',
  processInTransaction: true,
  handlerTimeoutMs: TIMEOUT_MS,
});

describe('Inbox: a handler that runs past handlerTimeoutMs (embedded SQLite)', () => {
  let t: OutboxTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('counts a failed attempt per timeout, retries only once the abandoned call returned, ends FAILED with the reason, and refuses the late writes of an abandoned call', async () => {
    t = await createOutboxTestApp(
      {
        inboxEvents: { ...FAST_BOX, retry: { ...FAST_BOX.retry, attempts: 2 } },
        outboxEvents: FAST_BOX,
      },
      [TaskCreated],
    );
    await t.outbox.transaction((tx) => tx.query('CREATE TABLE tasks (id TEXT PRIMARY KEY)'));
    const handler = t.handler(TaskCreated);
    const contexts: InboxContext[] = [];
    let releaseFirst!: () => void;
    const first = new Promise<void>((resolve) => (releaseFirst = resolve));
    const lateWrites: Array<Promise<unknown>> = [];
    handler.onCall = async (_message, context) => {
      contexts.push(context);
      if (context.attempt > 1) return new Promise<void>(() => undefined); // never returns
      await first; // ignores its signal, then writes as if nothing happened
      lateWrites.push(
        context.transaction!.query("INSERT INTO tasks (id) VALUES ('late')").then(
          () => 'written',
          (error: unknown) => error,
        ),
      );
    };
    const id = await publishInboxEvent(
      t.broker,
      'TaskCreated',
      { aggregateType: 'Task', aggregateId: 't-1' },
      { [MESSAGE_TYPE_HEADER]: 'TaskCreated', 'content-type': 'application/json' },
    );

    // The first call past its limit: its attempt counted, its retry due within 40 ms, but not
    // handed to the handler while the abandoned call still runs.
    await eventually(
      async () => (await t!.outbox.record('inbox_events', id))?.attempts === 1,
      'the first attempt counted',
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(contexts.map((context) => context.attempt)).toEqual([1]);
    expect((await t.outbox.record('inbox_events', id))?.status).toBe('PENDING');

    releaseFirst();
    await eventually(() => lateWrites.length === 1, 'the abandoned call to write');
    expect(await lateWrites[0]).toBeInstanceOf(HandlerTimeoutError);
    await eventually(
      async () => (await t!.outbox.record('inbox_events', id))?.status === 'FAILED',
      'the record to end FAILED',
    );
    expect(contexts.map((context) => context.attempt)).toEqual([1, 2]);
    expect(contexts.every((context) => context.signal.reason instanceof HandlerTimeoutError)).toBe(
      true,
    );
    expect((await t.outbox.record('inbox_events', id))?.lastError).toMatch(
      `timed out after ${TIMEOUT_MS} ms on event TaskCreated ${id} (attempt 2)`,
    );
    const rows = await t.outbox.transaction(
      async (tx) => (await tx.query<{ id: string }>('SELECT id FROM tasks')).rows,
    );
    expect(rows).toEqual([]);
    expect((await t.outbox.record('inbox_events', id))?.status).toBe('FAILED');
  });
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const LIMIT_MS = 150;

/**
 * What a call past its limit does afterwards, and what its aggregate's next calls wait for, on the
 * store `open()` makes (`undefined`: the embedded SQLite one) with its tables named by `table()`.
 */
function abandonedCallCase(open: () => OutboxStore | undefined, table: (name: string) => string) {
  let t: OutboxTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  const start = async (providers: [unknown], inboxEvents: BoxOptions) => {
    const store = open();
    t = await createOutboxTestApp({ ...(store && { store }), inboxEvents }, providers as never);
    return t;
  };
  const deliver = (aggregateId: string) =>
    publishInboxEvent(t!.broker, 'TaskCreated', { aggregateType: 'Task', aggregateId });
  const statusOf = async (id: string) => (await t!.outbox.record('inbox_events', id))?.status;

  it('refuses a transaction() a call starts once past its limit: nothing of it commits, the retry writes once', async () => {
    const refused: unknown[] = [];
    const announced: Array<{ attempt: number; id: string }> = [];
    let lateCallDone = false;
    @Injectable()
    class Tasks {
      constructor(private readonly outbox: OutboxService) {}
      @InboxHandler({ event: 'TaskCreated', handlerTimeoutMs: LIMIT_MS })
      async handle(event: OutboxEvent, { attempt }: InboxContext) {
        if (attempt === 1) await sleep(LIMIT_MS * 2); // ignores its signal, then carries on
        try {
          await this.outbox.transaction(async (tx) => {
            await tx.query(`INSERT INTO ${table('tasks')} (attempt) VALUES (${attempt})`);
            const id = tx.publishEvent({
              type: 'TaskAnnounced',
              aggregateType: 'Task',
              aggregateId: event.aggregateId,
              payload: {},
            });
            announced.push({ attempt, id });
          });
        } catch (error) {
          refused.push(error);
          throw error;
        } finally {
          if (attempt === 1) lateCallDone = true;
        }
      }
    }
    await start([Tasks], { ...FAST_BOX, retry: { ...FAST_BOX.retry, attempts: 3 } });
    await t!.outbox.transaction((tx) =>
      tx.query(`CREATE TABLE ${table('tasks')} (attempt integer)`),
    );
    const id = await deliver('t-1');

    await eventually(async () => (await statusOf(id)) === 'COMPLETED', 'the record handled');
    await eventually(() => lateCallDone, 'the abandoned call to finish');
    await sleep(100);
    const rows = await t!.outbox.transaction(
      async (tx) => (await tx.query(`SELECT attempt FROM ${table('tasks')}`)).rows,
    );
    const stored = await Promise.all(
      announced.map(async ({ attempt, id }) => ({
        attempt,
        stored: (await t!.outbox.record('outbox_events', id)) !== undefined,
      })),
    );
    expect({
      rows: rows.map((row) => Number(row.attempt)),
      announced: stored.filter((event) => event.stored).map((event) => event.attempt),
      refused,
      record: (await t!.outbox.record('inbox_events', id))?.attempts,
    }).toEqual({
      rows: [2],
      announced: [2],
      refused: [expect.any(HandlerTimeoutError)],
      record: 2,
    });
  });

  it.each([
    ['an ordered box', 'an aggregate', true],
    ['an unordered box', 'a message', false],
  ])(
    'in %s, calls no handler for %s while its abandoned call still runs; others go on',
    async (_box, _of, ordered) => {
      const Handler = inboxHandler({ event: 'TaskCreated', handlerTimeoutMs: LIMIT_MS });
      const running = new Map<string, number>();
      const events: string[] = [];
      await start([Handler], { ...FAST_BOX, ordered });
      t!.handler(Handler).onCall = async (message, { attempt }) => {
        const key = (message as OutboxEvent).aggregateId;
        running.set(key, (running.get(key) ?? 0) + 1);
        events.push(`${key}${attempt} starts with ${running.get(key)} running`);
        try {
          if (key === 'a' && attempt === 1) await sleep(LIMIT_MS * 6); // ignores its signal
        } finally {
          running.set(key, running.get(key)! - 1);
          events.push(`${key}${attempt} ends`);
        }
      };
      const a = await deliver('a');
      await eventually(() => events.length > 0, 'a1 called');
      const b = await deliver('b');

      await eventually(async () => (await statusOf(b)) === 'COMPLETED', 'b handled meanwhile');
      expect(running.get('a')).toBe(1);
      await eventually(async () => (await statusOf(a)) === 'COMPLETED', 'a handled', 5_000);
      expect(events).toEqual([
        'a1 starts with 1 running',
        'b1 starts with 1 running',
        'b1 ends',
        'a1 ends',
        'a2 starts with 1 running',
        'a2 ends',
      ]);
    },
  );

  it.each([
    ['an ordered box', 'its aggregate', true],
    ['an unordered box', 'its message', false],
  ])(
    'in %s, an abandoned call that never returns holds back %s, not the claims or the shutdown',
    async (_box, _what, ordered) => {
      const Handler = inboxHandler({ event: 'TaskCreated', handlerTimeoutMs: LIMIT_MS });
      // A full batch of one held record: claimed again at the poll's pace, not at once, for ever.
      await start([Handler], { ...FAST_BOX, ordered, batchSize: 1 });
      t!.handler(Handler).onCall = () => new Promise(() => undefined);
      const a = await deliver('a');
      await eventually(
        async () => (await t!.outbox.record('inbox_events', a))?.attempts === 1,
        'the first attempt counted',
      );
      await sleep(LIMIT_MS * 3);
      expect(t!.handler(Handler).calls).toHaveLength(1);
      const closing = Date.now();
      await t!.close();
      t = undefined;
      expect(Date.now() - closing).toBeLessThan(2_000);
    },
  );
}

describe('Inbox: a call abandoned past handlerTimeoutMs (embedded SQLite)', () => {
  abandonedCallCase(
    () => undefined,
    (name) => name,
  );
});

describeWithServer('postgres', 'Inbox: a call abandoned past handlerTimeoutMs (PostgreSQL)', () => {
  const stores: PostgresOutboxStore[] = [];
  const pg = usePostgres({
    beforeCleanup: async () => {
      for (const store of stores.splice(0)) await store.close().catch(() => undefined);
    },
  });

  // Nested: its app closes before the block drops the tables.
  describe('on a store of the module', () => {
    abandonedCallCase(
      () => {
        const store = PostgresOutboxStore.connect(SERVERS.postgres.url, {
          tablePrefix: pg.tablePrefix,
        });
        stores.push(store);
        return store;
      },
      (name) => `${pg.tablePrefix}${name}`,
    );
  });
});
