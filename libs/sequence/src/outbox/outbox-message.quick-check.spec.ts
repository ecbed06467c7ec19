import fc from 'fast-check';
import { OutboxCommand, OutboxEvent } from '../core/outbox-message';
import { parseMessage, validatedByRules } from './outbox-message.codec';
import { messageValidation } from './outbox-message.rules';

/**
 * Messages are checked by a quick check first and by the class-validator rules when it is unsure.
 * Whatever the quick check accepts, the rules accept too, and build the same message.
 */
describe('the quick check of outbox messages', () => {
  beforeAll(() => messageValidation());

  /** The outcome of `check`: the message as JSON, or the problems it was refused with. */
  function outcome(
    check: () => object,
  ): { json: string; prototype: object } | { problems: unknown } {
    try {
      const message = check();
      return { json: JSON.stringify(message), prototype: Object.getPrototypeOf(message) as object };
    } catch (error) {
      return { problems: (error as { problems?: unknown }).problems ?? String(error) };
    }
  }

  const text = fc.oneof(
    {
      arbitrary: fc.constantFrom('o-1', 'Order', 'OrderPlaced', 'tasks', 'a'.repeat(200)),
      weight: 6,
    },
    fc.constantFrom('', 'a'.repeat(201), ' ', '\u0000x', 'ü', '\uFE0F', '1abc', 'a b'),
    fc.string({ maxLength: 210 }),
    fc.string({ unit: 'grapheme', maxLength: 5 }),
    fc.uuid(),
  );
  const value = fc.oneof(
    { arbitrary: text, weight: 4 },
    fc.constant(undefined),
    fc.constant(null),
    fc.integer(),
  );
  const instant = fc.oneof(
    {
      arbitrary: fc
        .date({ min: new Date(-1e14), max: new Date(3e14), noInvalidDate: true })
        .map((d) => d.toISOString()),
      weight: 4,
    },
    fc.constantFrom('2026-02-30T10:00:00.000Z', '2026-12-02T06:00:00Z', '2026-12-02', 'now'),
    value,
  );
  const payload = fc.oneof({ arbitrary: fc.jsonValue(), weight: 4 }, fc.constant(undefined));
  const extra = fc.option(fc.record({ [`x${'tra'}`]: value }), { nil: undefined, freq: 4 });
  let accepted = 0;
  afterAll(() => {
    // The properties saw plenty of messages the quick check vouched for.
    expect(accepted).toBeGreaterThan(100);
  });

  it('accepts an event only as the rules would, building the same event', () => {
    fc.assert(
      fc.property(
        fc.record(
          {
            id: text,
            type: text,
            aggregateType: text,
            aggregateId: value,
            occurredAt: instant,
            tenantId: value,
            payload,
          },
          { requiredKeys: [] },
        ),
        extra,
        (fields, more) => {
          const plain = { ...fields, ...more };
          const body = JSON.stringify(plain);
          const quick = outcome(() => parseMessage('event', body));
          const rules = outcome(() => validatedByRules('event', OutboxEvent, JSON.parse(body)));
          expect(quick).toEqual(rules);
          if ('json' in quick) accepted += 1;
        },
      ),
      { numRuns: 3000 },
    );
  });

  it('accepts a command only as the rules would, building the same command', () => {
    fc.assert(
      fc.property(
        fc.record(
          { id: text, type: text, targetService: text, targetTenantId: value, payload },
          { requiredKeys: [] },
        ),
        extra,
        (fields, more) => {
          const body = JSON.stringify({ ...fields, ...more });
          const quick = outcome(() => parseMessage('command', body));
          const rules = outcome(() => validatedByRules('command', OutboxCommand, JSON.parse(body)));
          expect(quick).toEqual(rules);
          if ('json' in quick) accepted += 1;
        },
      ),
      { numRuns: 3000 },
    );
  });

  it.each(['0099-12-31T23:59:59.999Z', '0999-01-01T00:00:00.000Z', '0000-01-01T00:00:00.000Z'])(
    'answers as the rules do for an event that occurred at %s, before the year 1000',
    (occurredAt) => {
      const body = JSON.stringify({
        id: 'o-1',
        type: 'o-1',
        aggregateType: 'o-1',
        aggregateId: 'o-1',
        occurredAt,
        payload: [],
      });
      const quick = outcome(() => parseMessage('event', body));
      const rules = outcome(() => validatedByRules('event', OutboxEvent, JSON.parse(body)));
      expect(quick).toEqual(rules);
    },
  );

  it('builds a plainly valid event without the rules, as they would', () => {
    const body = JSON.stringify({
      id: 'e-1',
      type: 'OrderPlaced',
      aggregateType: 'Order',
      aggregateId: 'o-1',
      occurredAt: '2026-12-02T06:00:00.000Z',
      payload: { total: 42, '1': 'one', lines: [] },
    });
    const quick = parseMessage('event', body);
    expect(quick).toBeInstanceOf(OutboxEvent);
    expect(JSON.stringify(quick)).toBe(
      JSON.stringify(validatedByRules('event', OutboxEvent, JSON.parse(body))),
    );
  });
});
