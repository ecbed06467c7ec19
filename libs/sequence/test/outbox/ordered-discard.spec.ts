import { PublishRejectedError } from 'nest-sequence';
import { BoxesReader } from '../../src/admin/boxes.reader';
import { eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, type OutboxTestApp } from './outbox-test-app';

/**
 * Ordered outbox: a FAILED event holds back the rest of its aggregate. An operator's discard of
 * that head (the console's) unblocks the aggregate and, like a retry, wakes the relay: the
 * held-back events do not wait for the next poll (pollIntervalMs), here a minute.
 */
describe('ordered outbox: discarding the FAILED head of an aggregate', () => {
  let t: OutboxTestApp;
  afterEach(() => t?.close());

  it('publishes the events it held back without waiting for the next poll', async () => {
    t = await createOutboxTestApp({
      outboxEvents: { ordered: true, pollIntervalMs: 60_000, retry: { attempts: 1 } },
    });
    t.transport.beforePublish = (attempt) => {
      if (attempt.channel === 'events.Refused') {
        throw new PublishRejectedError(attempt.channel, new Error('nack'));
      }
    };
    const [head] = await t.outbox.transaction(async (tx) => [
      tx.publishEvent({ type: 'Refused', aggregateType: 'Order', aggregateId: '1', payload: {} }),
      tx.publishEvent({ type: 'Shipped', aggregateType: 'Order', aggregateId: '1', payload: {} }),
    ]);
    await eventually(
      async () => (await t.outbox.record('outbox_events', head))?.status === 'FAILED',
      'the head FAILED',
    );
    await t.runtime.idle();
    expect(t.broker.peek('events.Shipped')).toHaveLength(0);

    const answer = await new BoxesReader(t.runtime).discard('outbox', [head], 'outbox_events');
    expect(answer.changed).toBe(1);

    await eventually(
      () => t.broker.peek('events.Shipped').length === 1,
      'the held-back event published after the discard',
      2_000,
    );
  });
});
