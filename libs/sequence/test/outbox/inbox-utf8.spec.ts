import { MESSAGE_KIND_HEADER, MESSAGE_TYPE_HEADER } from 'nest-sequence/wire';
import { deadLetters, deathReasonOf, eventually } from '../support/sequence-test-app';
import { createOutboxTestApp, FAST_BOX, inboxHandler, type OutboxTestApp } from './outbox-test-app';

/**
 * JSON on the wire is UTF-8: a body that is not is an invalid message, dead-lettered with the
 * reason, never decoded with U+FFFD in place of its bytes (which would make two ids one).
 */
const TaskCreated = inboxHandler({ event: 'TaskCreated' });

/** A TaskCreated event whose JSON has `idBytes` (raw, not UTF-8) in its id. */
function latin1Event(idBytes: Buffer): Buffer {
  const head = Buffer.from('{"id":"task-');
  const tail = Buffer.from(
    '","type":"TaskCreated","aggregateType":"Task","aggregateId":"t-1","payload":{},' +
      `"occurredAt":"${new Date().toISOString()}"}`,
  );
  return Buffer.concat([head, idBytes, tail]);
}

describe('inbox: bodies that are not UTF-8', () => {
  let t: OutboxTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('does not take two ids that differ in bytes that are not UTF-8 for one', async () => {
    t = await createOutboxTestApp({ inboxEvents: FAST_BOX }, [TaskCreated]);
    const handler = t.handler(TaskCreated);
    const headers = { [MESSAGE_KIND_HEADER]: 'event', [MESSAGE_TYPE_HEADER]: 'TaskCreated' };
    // Latin-1 'é' (0xE9) and 'è' (0xE8): two different ids on the wire.
    await t.broker.publish('events.TaskCreated', latin1Event(Buffer.from([0xe9])), headers);
    await t.broker.publish('events.TaskCreated', latin1Event(Buffer.from([0xe8])), headers);
    // Both refused, each with the reason: neither acked as a "duplicate" of the other.
    await eventually(
      () => deadLetters(t!.broker, 'events.TaskCreated').length === 2,
      'both dead-lettered',
    );
    expect(handler.calls).toHaveLength(0);
  });

  it('dead-letters a body that is not UTF-8 invalid-inbox-message', async () => {
    t = await createOutboxTestApp({ inboxEvents: FAST_BOX }, [TaskCreated]);
    const handler = t.handler(TaskCreated);
    const body = Buffer.concat([
      Buffer.from(
        '{"id":"e-1","type":"TaskCreated","aggregateType":"Task","aggregateId":"t-1",' +
          `"occurredAt":"${new Date().toISOString()}","payload":{"title":"caf`,
      ),
      Buffer.from([0xe9]), // Latin-1 é
      Buffer.from('"}}'),
    ]);
    await t.broker.publish('events.TaskCreated', body, {
      [MESSAGE_KIND_HEADER]: 'event',
      [MESSAGE_TYPE_HEADER]: 'TaskCreated',
    });
    await eventually(
      () => handler.calls.length + deadLetters(t!.broker, 'events.TaskCreated').length >= 1,
      'handled or dead-lettered',
    );
    expect({
      handledPayloads: handler.calls.map((call) => call.payload),
      reasons: deadLetters(t.broker, 'events.TaskCreated').map(deathReasonOf),
    }).toEqual({
      handledPayloads: [],
      reasons: [expect.stringMatching(/^invalid-inbox-message: .*not UTF-8/)],
    });
  });
});
