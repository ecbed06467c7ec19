import { randomUUID } from 'node:crypto';
import {
  decodeHeaders,
  encodedHeaderBytes,
  encodeHeaders,
  fitForwardedHeaders,
  HEADER_TYPES_HEADER,
  headerNameProblem,
  MSG_ID_HEADER,
  readHeaders,
} from './nats.headers';

/** The pairs of `headers` as NATS hands them back: one value list per name. */
function roundTrip(headers: Record<string, unknown>): Record<string, unknown> {
  const encoded = encodeHeaders(headers);
  if (encoded.problem !== undefined) throw new Error(encoded.problem);
  return decodeHeaders(encoded.pairs.map(([name, value]) => [name, [value]] as const));
}

describe('NATS header codec', () => {
  it('keeps strings, numbers and booleans with their types', () => {
    const headers = { 'x-text': 'héllo', 'x-numeric-text': '42', 'x-n': -7.5, 'x-yes': true };
    expect(roundTrip(headers)).toEqual(headers);
  });

  it('keeps values NATS would trim or cannot carry: line breaks and surrounding spaces', () => {
    const headers = { reason: 'line one\r\nline two', padded: '  x  ', empty: '' };
    expect(roundTrip(headers)).toEqual(headers);
  });

  it('lists one type letter per header in its own header', () => {
    expect(encodeHeaders({ a: 'x', b: 1, c: false })).toEqual({
      pairs: [
        ['a', 'x'],
        ['b', '1'],
        ['c', 'false'],
        [HEADER_TYPES_HEADER, 'snb'],
      ],
    });
  });

  it('round-trips every number, and keeps as text what another program typed n in other forms', () => {
    const numbers = [0, -5, 1.5, 1e21, 1e-7, -2.5e-300, Number.MAX_SAFE_INTEGER, Infinity, NaN];
    const headers = Object.fromEntries(numbers.map((value, index) => [`x-${index}`, value]));
    expect(roundTrip(headers)).toEqual(headers);

    const texts = ['', ' 12', '012', '0x10', '1e3', '+1', '1.'];
    const decoded = decodeHeaders([
      ...texts.map((text, index) => [`x-${index}`, [text]] as const),
      [HEADER_TYPES_HEADER, ['n'.repeat(texts.length)]],
    ]);
    expect(Object.values(decoded)).toEqual(texts);
  });

  it('reads the headers of a message from another program as strings, NATS-* left out', () => {
    const decoded = decodeHeaders([
      ['x-count', ['3']],
      ['Nats-Msg-Id', ['abc']],
    ]);
    expect(decoded).toEqual({ 'x-count': '3' });
  });

  it("keeps headers named after Object.prototype's members as headers of their own", () => {
    const decoded = decodeHeaders([
      ['constructor', ['a']],
      ['toString', ['b']],
      ['__proto__', ['c']],
      ['x-a', ['d']],
    ]);
    expect(Object.keys(decoded)).toEqual(['constructor', 'toString', '__proto__', 'x-a']);
    expect(Object.getPrototypeOf(decoded)).toBe(Object.prototype);
    expect(decoded.toString).toBe('b');
  });

  it('reads headers the client cannot decode as none, saying why', () => {
    expect(readHeaders(() => [['x-a', ['1']]])).toEqual({ headers: { 'x-a': '1' } });
    const broken = readHeaders(() => {
      throw new Error('invalid header name: Bad Name');
    });
    expect(broken).toEqual({ headers: {}, problem: 'invalid header name: Bad Name' });
  });

  it('refuses names NATS cannot carry and names that steer the server', () => {
    for (const name of ['with space', 'colon:', 'Nats-Expected-Stream', 'nats-msg-id', '']) {
      expect({ name, problem: headerNameProblem(name) }).toEqual({
        name,
        problem: expect.any(String),
      });
    }
    expect(encodeHeaders({ 'Nats-Msg-Id': 'x' })).toMatchObject({ name: 'Nats-Msg-Id' });
  });

  it('counts the bytes of the header block as NATS writes it', () => {
    // NATS/1.0\r\n a: b\r\n \r\n
    expect(encodedHeaderBytes([['a', 'b']])).toBe(10 + 6 + 2);
  });
});

describe('fitForwardedHeaders', () => {
  const names = {
    reason: 'x-death-reason',
    dropped: 'x-dropped-headers',
    keep: ['x-requeue-count'],
  };
  const bytes = (headers: Record<string, unknown>) => {
    const encoded = encodeHeaders(headers);
    if (encoded.problem !== undefined) throw new Error(encoded.problem);
    return encodedHeaderBytes([...encoded.pairs, [MSG_ID_HEADER, randomUUID()]]);
  };
  const headers = {
    'x-sequence-id': 'seq-1',
    'x-note': 'n'.repeat(300),
    'x-death-reason': `handler-failed: ${'not a known SKU; '.repeat(30)}`,
  };

  it('gives headers that fit as they are, the same object', () => {
    expect(fitForwardedHeaders(headers, bytes(headers), names)).toBe(headers);
  });

  it("cuts a long reason first, keeping the message's own headers", () => {
    const room = bytes({ ...headers, 'x-death-reason': 'r'.repeat(100) });
    const fitted = fitForwardedHeaders(headers, room, names)!;
    expect({ ...fitted, 'x-death-reason': undefined }).toEqual({
      ...headers,
      'x-death-reason': undefined,
    });
    expect(String(fitted['x-death-reason'])).toMatch(/^handler-failed: not a known SKU; .*…$/);
    expect(bytes(fitted)).toBeLessThanOrEqual(room);
  });

  it('then leaves out the largest other headers, naming them', () => {
    const fitted = fitForwardedHeaders(headers, bytes(headers) - 500, names)!;
    expect(fitted['x-note']).toBeUndefined();
    expect(fitted['x-dropped-headers']).toBe('x-note');
    expect(fitted['x-sequence-id']).toBe('seq-1');
    expect(String(fitted['x-death-reason'])).toMatch(/^handler-failed: not a known SKU; /);
    expect(bytes(fitted)).toBeLessThanOrEqual(bytes(headers) - 500);
  });

  it('then cuts the reason further, keeping its start', () => {
    const room = bytes({ 'x-dropped-headers': 'x-note,x-sequence-id', 'x-death-reason': 'h' }) + 20;
    const fitted = fitForwardedHeaders(headers, room, names)!;
    expect(String(fitted['x-death-reason'])).toMatch(/^handler-failed.*…$/);
    expect(bytes(fitted)).toBeLessThanOrEqual(room);
  });

  it('keeps the headers named in keep', () => {
    const requeued = { 'x-requeue-count': 3, 'x-big': 'b'.repeat(100) };
    const fitted = fitForwardedHeaders(requeued, bytes({ 'x-requeue-count': 3 }) + 40, names);
    expect(fitted).toEqual({ 'x-requeue-count': 3, 'x-dropped-headers': 'x-big' });
  });

  it('gives undefined when nothing makes them fit', () => {
    expect(fitForwardedHeaders(headers, 60, names)).toBeUndefined();
  });
});
