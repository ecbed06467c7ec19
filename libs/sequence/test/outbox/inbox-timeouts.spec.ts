import { HandlerTimeoutError, type InboxContext } from 'nest-sequence';
import { MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
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

  it('counts a failed attempt per timeout, ends FAILED with the reason, and refuses the late writes of an abandoned call', async () => {
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

    releaseFirst();
    await eventually(() => lateWrites.length === 1, 'the abandoned call to write');
    expect(await lateWrites[0]).toBeInstanceOf(HandlerTimeoutError);
    const rows = await t.outbox.transaction(
      async (tx) => (await tx.query<{ id: string }>('SELECT id FROM tasks')).rows,
    );
    expect(rows).toEqual([]);
    expect((await t.outbox.record('inbox_events', id))?.status).toBe('FAILED');
  });
});
