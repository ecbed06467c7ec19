import { InvalidOutboxMessageError } from '../core/errors/invalid-outbox-message.error';
import {
  commandRecord,
  eventRecord,
  parseMessage,
  toCommand,
  toEvent,
} from './outbox-message.codec';
import { checkedHeaders } from './outbox-transaction';

const event = {
  type: 'OrderPlaced',
  aggregateType: 'Order',
  aggregateId: 'o-1',
  payload: { total: 42, lines: [{ sku: 'A', qty: 2 }] },
};
const command = { type: 'ArchiveTask', targetService: 'tasks', payload: { taskId: 't-1' } };

function problemsOf(run: () => unknown): readonly string[] {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(InvalidOutboxMessageError);
    return (error as InvalidOutboxMessageError).problems;
  }
  throw new Error('expected an InvalidOutboxMessageError');
}

describe('outbox messages', () => {
  it('relays the payload as the JSON it is, whatever its keys and values', () => {
    /** A money type as libraries write them: state in a private field, JSON through toJSON. */
    class Amount {
      #value: string;
      constructor(value: string) {
        this.#value = value;
      }
      toJSON(): string {
        return this.#value;
      }
    }
    const payload = {
      constructor: 'Ferrari',
      toString: 'plain text',
      hasOwnProperty: true,
      amount: new Amount('1.50'),
      nested: { valueOf: 3, list: [1, { toString: 'x' }] },
    };
    const expected = JSON.parse(JSON.stringify(payload)) as unknown;
    // Before, class-transformer rebuilt the payload: the keys named like Object.prototype's
    // methods were dropped, and the Amount was rebuilt without its value.
    const made = toEvent({ ...event, payload });
    expect(made.payload).toEqual(expected);
    expect(JSON.parse(eventRecord(made).body).payload).toEqual(expected);
    expect(parseMessage('event', eventRecord(made).body).payload).toEqual(expected);
    // Detached from the caller's object: a change after recording is not relayed.
    payload.nested.valueOf = 4;
    expect((made.payload as { nested: { valueOf: number } }).nested.valueOf).toBe(3);
  });

  it('refuses a payload that serializes to null, which every inbox would refuse', () => {
    for (const payload of [Number.NaN, Infinity, new Date(Number.NaN), { toJSON: () => null }]) {
      expect(problemsOf(() => toEvent({ ...event, payload }))).toEqual([
        'payload must not serialize to null',
      ]);
    }
  });

  it('refuses an id with a lone surrogate, which the database would store as another id', () => {
    for (const id of ['x\uD800', 'x\uDC00y']) {
      expect(problemsOf(() => toEvent({ ...event, id }))).toEqual([
        'id must be well-formed Unicode (it has a lone surrogate)',
      ]);
    }
    expect(toEvent({ ...event, id: 'x\uD83D\uDE00' }).id).toBe('x😀');
  });

  it('refuses a NUL character in a field stored in its own column, which PostgreSQL refuses', () => {
    expect(problemsOf(() => toEvent({ ...event, aggregateId: 'a\u0000b' }))).toEqual([
      'aggregateId must not contain the NUL character (U+0000): databases refuse it in text',
    ]);
    expect(problemsOf(() => toEvent({ ...event, tenantId: 't\u0000' }))).toEqual([
      'tenantId must not contain the NUL character (U+0000): databases refuse it in text',
    ]);
    // The payload travels as JSON text, where it is escaped: accepted.
    expect(toCommand({ type: 'Archive', targetService: 'tasks', payload: 'a\u0000' }).payload).toBe(
      'a\u0000',
    );
    // Headers are stored as JSON too, but PostgreSQL's jsonb refuses an escaped NUL.
    expect(
      problemsOf(() => checkedHeaders('event', { 'trace\u0000': 'x', ok: 'y\u0000' })),
    ).toEqual([
      'header trace\u0000 must not contain the NUL character (U+0000)',
      'header ok must not contain the NUL character (U+0000)',
    ]);
  });

  it('an event gets a UUID id and the time it occurred when not given', () => {
    const before = Date.now();
    const made = toEvent(event);
    expect(made.id).toMatch(/^[0-9a-f-]{36}$/);
    expect(Date.parse(made.occurredAt)).toBeGreaterThanOrEqual(before - 1);
    expect(toEvent(event).id).not.toBe(made.id);
  });

  it('keeps a given id and occurredAt, and turns a numeric aggregate id into a string', () => {
    const made = toEvent({ ...event, id: 'evt-1', aggregateId: 7, occurredAt: new Date(0) });
    expect(made).toMatchObject({
      id: 'evt-1',
      aggregateId: '7',
      occurredAt: '1970-01-01T00:00:00.000Z',
    });
  });

  it('refuses an event without its aggregate, naming each missing field', () => {
    const problems = problemsOf(() => toEvent({ type: 'X', payload: 1 } as never));
    expect(problems.join('\n')).toMatch(/aggregateType/);
    expect(problems.join('\n')).toMatch(/aggregateId/);
  });

  it('refuses a command field on an event, and an event field on a command', () => {
    expect(problemsOf(() => toEvent({ ...event, targetService: 'x' } as never)).join()).toMatch(
      /targetService should not exist/,
    );
    expect(problemsOf(() => toCommand({ ...command, aggregateId: 'x' } as never)).join()).toMatch(
      /aggregateId should not exist/,
    );
  });

  it('refuses a payload JSON cannot carry, and a missing one', () => {
    expect(problemsOf(() => toEvent({ ...event, payload: { n: 10n } })).join()).toMatch(
      /not JSON-serializable/,
    );
    // JSON would carry a Map or a Set as {}: refused rather than relayed empty.
    expect(
      problemsOf(() =>
        toEvent({ ...event, payload: { lines: [{ tags: new Set(['a']) }] } }),
      ).join(),
    ).toMatch(/not JSON-serializable \(the property "tags" is a Set/);
    expect(problemsOf(() => toCommand({ ...command, payload: new Map() })).join()).toMatch(
      /the data is a Map/,
    );
    // Nor a value not awaited: an event would carry {} for the order it was meant to describe.
    expect(
      problemsOf(() =>
        toEvent({ ...event, payload: { order: Promise.resolve({ id: 1 }) } }),
      ).join(),
    ).toMatch(/the property "order" is a Promise/);
    expect(problemsOf(() => toCommand({ ...command, payload: undefined })).join()).toMatch(
      /payload/,
    );
  });

  it('refuses a type or a target service that cannot name a channel', () => {
    expect(problemsOf(() => toEvent({ ...event, type: 'has space' })).join()).toMatch(/type/);
    expect(problemsOf(() => toCommand({ ...command, targetService: 'a/b' })).join()).toMatch(
      /targetService/,
    );
  });

  it('an event record is partitioned by its aggregate; a command record by nothing', () => {
    const record = eventRecord(toEvent({ ...event, id: 'e1' }), { traceparent: 't' });
    expect(record).toMatchObject({
      id: 'e1',
      kind: 'event',
      type: 'OrderPlaced',
      partitionKey: '["Order","o-1"]',
      headers: { traceparent: 't' },
    });
    expect(commandRecord(toCommand({ ...command, id: 'c1' })).partitionKey).toBeNull();
  });

  it('keeps the partitions of two aggregates apart whatever their names hold', () => {
    const a = eventRecord(toEvent({ ...event, aggregateType: 'Order:eu', aggregateId: '1' }), {});
    const b = eventRecord(toEvent({ ...event, aggregateType: 'Order', aggregateId: 'eu:1' }), {});
    expect(a.partitionKey).not.toBe(b.partitionKey);
  });

  it('refuses a lone surrogate in any text field and in headers, which UTF-8 cannot store', () => {
    expect(problemsOf(() => toEvent({ ...event, aggregateType: 'Order\uD800' }))).toEqual([
      'aggregateType must be well-formed Unicode (it has a lone surrogate)',
    ]);
    expect(problemsOf(() => toEvent({ ...event, aggregateId: '\uDC00' }))).toEqual([
      'aggregateId must be well-formed Unicode (it has a lone surrogate)',
    ]);
    expect(problemsOf(() => toEvent({ ...event, tenantId: 't\uD800' }))).toEqual([
      'tenantId must be well-formed Unicode (it has a lone surrogate)',
    ]);
    expect(problemsOf(() => checkedHeaders('event', { 'x\uD800': 'a', ok: 'b\uDC00' }))).toEqual([
      'header x\uD800 must be well-formed Unicode (it has a lone surrogate)',
      'header ok must be well-formed Unicode (it has a lone surrogate)',
    ]);
  });

  it('quotes an invalid message id in its error, control characters escaped', () => {
    let message = '';
    try {
      toEvent({ ...event, id: 'evil\nid\u001b[31m', aggregateId: '' });
    } catch (error) {
      message = (error as Error).message;
    }
    expect(message).toContain('invalid event "evil\\nid\\u001b[31m"');
    expect([...message].filter((char) => char.charCodeAt(0) < 0x20)).toEqual([]);
  });

  it('a record body parses back to the same message', () => {
    const made = toEvent({ ...event, tenantId: 'acme' });
    expect({ ...parseMessage('event', eventRecord(made).body) }).toEqual({ ...made });
    const sent = toCommand({ ...command, targetTenantId: 'acme' });
    expect({ ...parseMessage('command', commandRecord(sent).body) }).toEqual({ ...sent });
  });

  it('a relayed body lists the fields in one fixed order, without absent ones', () => {
    const made = toEvent({ ...event, tenantId: 'acme' });
    expect(Object.keys(JSON.parse(eventRecord(made).body) as object)).toEqual([
      'id',
      'type',
      'aggregateType',
      'aggregateId',
      'payload',
      'occurredAt',
      'tenantId',
    ]);
    const sent = toCommand(command);
    expect(Object.keys(JSON.parse(commandRecord(sent).body) as object)).toEqual([
      'id',
      'type',
      'targetService',
      'payload',
    ]);
  });

  it('parsing refuses a body that is not JSON, or is the other kind', () => {
    expect(problemsOf(() => parseMessage('event', '{oops')).join()).toMatch(/not JSON/);
    const body = commandRecord(toCommand(command)).body;
    expect(problemsOf(() => parseMessage('event', body)).join()).toMatch(/should not exist/);
  });
});
