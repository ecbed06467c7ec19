import { claimCheckMarking, userHeadersOf } from './claim-check-headers';

/**
 * `x-claim-check` says whether a body is a ticket or the payload itself. Another program's AMQP
 * client may send it as a byte array (a Buffer here); a value that says neither is refused rather
 * than guessed, since a ticket taken for an inline payload hands its handler the ticket's JSON.
 */
describe('claimCheckMarking', () => {
  const marking = (value: unknown) => claimCheckMarking({ 'x-claim-check': value });

  it.each<[string, unknown]>([
    ['the number 1', 1],
    ['the string "1"', '1'],
    ['true', true],
    ['the string "true"', 'true'],
    ['the bytes "1"', Buffer.from('1')],
    ['the bytes "true"', Buffer.from('true')],
  ])('%s: a ticket', (_what, value) => {
    expect(marking(value)).toEqual({ via: 'ticket' });
  });

  it.each<[string, unknown]>([
    ['no header', undefined],
    ['null', null],
    ['the number 0', 0],
    ['the string "0"', '0'],
    ['false', false],
    ['the string "false"', 'false'],
    ['the bytes "0"', Buffer.from('0')],
    ['the bytes "false"', Buffer.from('false')],
  ])('%s: inline', (_what, value) => {
    expect(marking(value)).toEqual({ via: 'inline' });
  });

  it.each<[string, unknown, string]>([
    ['the number 2', 2, '2'],
    ['the string "yes"', 'yes', '"yes"'],
    ['the bytes "yes"', Buffer.from('yes'), '"yes"'],
    ['an empty string', '', '""'],
    ['a table', { value: 1 }, '[object Object]'],
  ])('%s: unrecognised, with a problem that quotes it', (_what, value, quoted) => {
    expect(marking(value)).toEqual({
      via: 'unrecognised',
      problem:
        `x-claim-check is ${quoted}; expected 1 or true (the body is a ticket), ` +
        '0 or false (the body is the payload), or no such header',
    });
  });
});

describe('userHeadersOf', () => {
  it("keeps the sender's headers, without ours, the transport's or the trace context", () => {
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    const own = userHeadersOf({
      'x-claim-check': 1,
      'x-death': 'x',
      traceparent,
      tracestate: 'vendor=1',
      'x-message-traceparent': traceparent,
      'x-message-tracestate': 'vendor=1',
      tenant: 'acme',
      priority: 2,
    });

    expect(own).toEqual({ tenant: 'acme', priority: 2 });
  });
});
