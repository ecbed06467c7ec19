import {
  decodeHeaders,
  encodedHeaderBytes,
  encodeHeaders,
  HEADER_TYPES_HEADER,
  headerNameProblem,
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

  it('reads the headers of a message from another program as strings, NATS-* left out', () => {
    const decoded = decodeHeaders([
      ['x-count', ['3']],
      ['Nats-Msg-Id', ['abc']],
    ]);
    expect(decoded).toEqual({ 'x-count': '3' });
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
