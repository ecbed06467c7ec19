import { MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
import { eventually } from '../support/sequence-test-app';
import {
  createOutboxTestApp,
  FAST_BOX,
  inboxHandler,
  publishInboxEvent,
  type OutboxTestApp,
} from './outbox-test-app';

/**
 * A thrown value that `String()` cannot convert (an object without a prototype, as some libraries
 * build) still counts as a failed attempt: described, retried, then `FAILED`. Describing it must
 * not fail in turn and take the claim's other records with it.
 */
const TaskCreated = inboxHandler({ event: 'TaskCreated' });

/** A value JavaScript can throw but `String()` cannot convert. */
function undescribable(): unknown {
  const value = Object.create(null) as Record<string, unknown>;
  value.code = 'E_DOWNSTREAM';
  return value;
}

describe('outbox and inbox: a thrown value String() cannot convert', () => {
  let t: OutboxTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('inbox: a handler that throws a null-prototype object ends FAILED after retry.attempts', async () => {
    t = await createOutboxTestApp(
      { inboxEvents: { ...FAST_BOX, retry: { ...FAST_BOX.retry, attempts: 3 } } },
      [TaskCreated],
    );
    const handler = t.handler(TaskCreated);
    handler.onCall = () => {
      throw undescribable();
    };
    const id = await publishInboxEvent(
      t.broker,
      'TaskCreated',
      { aggregateType: 'Task', aggregateId: 't-1' },
      { [MESSAGE_TYPE_HEADER]: 'TaskCreated' },
    );
    // FAST_BOX backs off 10-40 ms: three attempts take well under a second.
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    const record = await t.outbox.record('inbox_events', id);
    expect({
      status: record?.status,
      attempts: record?.attempts,
      calls: handler.calls.length,
    }).toEqual({
      status: 'FAILED',
      attempts: 3,
      calls: 3,
    });
  });

  it('outbox: a transport that rejects with a null-prototype object: the record ends FAILED, its batch neighbour is published once', async () => {
    t = await createOutboxTestApp({
      outboxEvents: { ...FAST_BOX, retry: { ...FAST_BOX.retry, attempts: 3 } },
    });
    t.transport.beforePublish = (attempt) => {
      if (attempt.channel === 'events.Poison') throw undescribable();
    };
    // Recorded in one transaction: claimed in one batch.
    const [poison, good] = await t.outbox.transaction(async (tx) => [
      tx.publishEvent({ type: 'Poison', aggregateType: 'X', aggregateId: '1', payload: {} }),
      tx.publishEvent({ type: 'Fine', aggregateType: 'X', aggregateId: '2', payload: {} }),
    ]);
    await eventually(() => t!.broker.peek('events.Fine').length >= 1, 'the good event published');
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    const state = {
      poison: (await t.outbox.record('outbox_events', poison))?.status,
      good: (await t.outbox.record('outbox_events', good))?.status,
      goodCopies: t.broker.peek('events.Fine').length,
    };
    expect(state).toEqual({ poison: 'FAILED', good: 'COMPLETED', goodCopies: 1 });
  });
});
