import { randomUUID } from 'node:crypto';
import { PublishRejectedError, SequenceEvents, type LifecycleEvent } from 'nest-sequence';
import { MESSAGE_ID_HEADER, MESSAGE_KIND_HEADER, MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
import { eventually } from '../support/sequence-test-app';
import {
  createOutboxTestApp,
  FAST_BOX,
  inboxHandler,
  type OutboxTestApp,
  publishInboxEvent,
} from '../outbox/outbox-test-app';
import { recordEvents } from './event-recorder';

const placed = (orderId: string) => ({
  type: 'OrderPlaced',
  aggregateType: 'Order',
  aggregateId: orderId,
  payload: { orderId },
});

const TaskCreated = inboxHandler({ event: 'TaskCreated' });

/** Outbox and inbox lifecycle events, on the embedded SQLite store and the in-memory broker. */
describe('lifecycle events: Outbox and Inbox', () => {
  let t: OutboxTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('a row the broker refuses once: retried with the error, then published with its lag', async () => {
    t = await createOutboxTestApp({ outboxEvents: FAST_BOX });
    const recorder = recordEvents(t.app);
    let refusals = 1;
    t.transport.beforePublish = (attempt) => {
      if (refusals-- > 0) throw new PublishRejectedError(attempt.channel, new Error('nack'));
    };

    const id = await t.outbox.transaction(async (tx) => tx.publishEvent(placed('o-1')));
    await eventually(() => recorder.only('outbox.published').length === 1, 'published');

    const row = { id, kind: 'event', messageType: 'OrderPlaced' };
    expect(recorder.events).toEqual([
      {
        ...row,
        type: 'outbox.retried',
        at: expect.any(Number),
        channel: 'events.OrderPlaced',
        attempts: 1,
        reason: expect.stringMatching(/^PublishRejectedError: /),
        nextAttemptAt: expect.any(Number),
      },
      {
        ...row,
        type: 'outbox.published',
        at: expect.any(Number),
        channel: 'events.OrderPlaced',
        channels: ['events.OrderPlaced'],
        attempts: 2,
        lagMs: expect.any(Number),
      },
    ]);
  });

  it("a subscriber's own transaction, opened as the relay emits, is not the relay's claim", async () => {
    t = await createOutboxTestApp({ outboxEvents: FAST_BOX });
    const { outbox } = t;
    await outbox.transaction((tx) => tx.query('CREATE TABLE audit (n TEXT)'));
    const audits: Promise<unknown>[] = [];
    t.app
      .get(SequenceEvents)
      .of('outbox.published')
      .subscribe(() => {
        // Not awaited: the listener hands the work off, as docs/events.md advises.
        audits.push(
          outbox.transaction(async (tx) => {
            await tx.query("INSERT INTO audit VALUES ('first')");
            await new Promise((resolve) => setTimeout(resolve, 20));
            await tx.query("INSERT INTO audit VALUES ('second')");
          }),
        );
      });

    await outbox.transaction(async (tx) => tx.publishEvent(placed('o-audit')));
    await eventually(() => audits.length === 1, 'the audit transaction');

    await expect(audits[0]).resolves.toBeUndefined();
    const { rows } = await outbox.transaction((tx) =>
      tx.query<{ n: string }>('SELECT n FROM audit'),
    );
    expect(rows.map((row) => row.n)).toEqual(['first', 'second']);
  });

  it('a row out of attempts: failed; retried by hand, then published', async () => {
    t = await createOutboxTestApp({
      outboxEvents: { ...FAST_BOX, retry: { ...FAST_BOX.retry, attempts: 1 } },
    });
    const recorder = recordEvents(t.app);
    t.transport.beforePublish = (attempt) => {
      throw new PublishRejectedError(attempt.channel, new Error('nack'));
    };

    const id = await t.outbox.transaction(async (tx) => tx.publishEvent(placed('o-2')));
    await eventually(() => recorder.only('outbox.failed').length === 1, 'failed');
    t.transport.beforePublish = () => undefined;
    expect(await t.outbox.retry('outbox_events', [id])).toBe(1);
    await eventually(() => recorder.only('outbox.published').length === 1, 'published');

    expect(
      recorder.events.map((event) => [event.type, 'attempts' in event && event.attempts]),
    ).toEqual([
      ['outbox.failed', 1],
      // A retry by hand gives the row its attempts afresh.
      ['outbox.published', 1],
    ]);
    expect(recorder.events[0]).toMatchObject({
      id,
      channel: 'events.OrderPlaced',
      reason: expect.stringMatching(/^PublishRejectedError: /),
    });
  });

  it('an inbox message handled once; its copy is a duplicate', async () => {
    t = await createOutboxTestApp({ inboxEvents: FAST_BOX }, [TaskCreated]);
    const recorder = recordEvents(t.app);
    const id = randomUUID();
    const event = {
      id,
      type: 'TaskCreated',
      aggregateType: 'Task',
      aggregateId: 't-1',
      payload: {},
      occurredAt: new Date().toISOString(),
    };
    const headers = {
      [MESSAGE_ID_HEADER]: id,
      [MESSAGE_KIND_HEADER]: 'event',
      [MESSAGE_TYPE_HEADER]: 'TaskCreated',
    };
    const channel = 'events.TaskCreated';

    await t.broker.publish(channel, Buffer.from(JSON.stringify(event)), headers);
    await eventually(() => recorder.only('inbox.handled').length === 1, 'handled');
    await t.broker.publish(channel, Buffer.from(JSON.stringify(event)), headers);
    await eventually(() => recorder.only('inbox.duplicate').length === 1, 'the duplicate');

    const row = { id, kind: 'event' as const, messageType: 'TaskCreated' };
    expect(recorder.events).toEqual<LifecycleEvent[]>([
      {
        ...row,
        type: 'inbox.handled',
        at: expect.any(Number) as number,
        channel,
        attempts: 1,
        lagMs: expect.any(Number) as number,
      },
      { ...row, type: 'inbox.duplicate', at: expect.any(Number) as number, channel },
    ]);
    expect(t.handler(TaskCreated).calls).toHaveLength(1);
  });

  it('an inbox handler that throws: the row is retried with the error', async () => {
    t = await createOutboxTestApp({ inboxEvents: FAST_BOX }, [TaskCreated]);
    let failures = 1;
    t.handler(TaskCreated).onCall = () => {
      if (failures-- > 0) throw new Error('database busy');
    };
    const recorder = recordEvents(t.app);

    const id = await publishInboxEvent(
      t.broker,
      'TaskCreated',
      { aggregateType: 'Task', aggregateId: 't' },
      { [MESSAGE_TYPE_HEADER]: 'TaskCreated' },
    );
    await eventually(() => recorder.only('inbox.handled').length === 1, 'handled');

    expect(recorder.events.map((event) => event.type)).toEqual(['inbox.retried', 'inbox.handled']);
    expect(recorder.events[0]).toMatchObject({
      id,
      channel: 'events.TaskCreated',
      attempts: 1,
      reason: 'Error: database busy',
    });
  });
});
