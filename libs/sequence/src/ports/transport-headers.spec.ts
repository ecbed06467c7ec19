import { InvalidHeaderError } from '../core/errors/invalid-header.error';
import {
  assertEncodableHeaders,
  DROPPED_HEADERS_HEADER,
  droppedHeadersList,
  encodedHeaders,
  forwardableHeaders,
  MAX_ENCODED_HEADER_BYTES,
} from './transport-headers';

// amqplib's own table encoder, the code these rules protect (an internal module of amqplib 0.10).
// eslint-disable-next-line @typescript-eslint/no-require-imports
const { encodeTable } = require('amqplib/lib/codec') as {
  encodeTable(buffer: Buffer, table: Record<string, unknown>, offset: number): number;
};

/** What amqplib does with `headers` in its 64 KiB scratch buffer: the encoded size, or throws. */
function amqplibEncodes(headers: Record<string, unknown>): number {
  return encodeTable(Buffer.alloc(64 * 1024), headers, 0);
}

describe('assertEncodableHeaders (what every transport carries)', () => {
  it.each<[string, Record<string, unknown>]>([
    ['NaN', { n: Number.NaN }],
    ['-Infinity', { n: -Infinity }],
    ['a fraction at 2^50', { n: 2 ** 50 + 0.5 }],
    ['a fraction at 2^51', { n: 2 ** 51 + 0.5 }],
    ['below -2^63', { n: -(2 ** 63) - 4096 }],
    ['a 256-byte name', { ['k'.repeat(256)]: 1 }],
    // What a message another program published can carry, which a dead letter carries on.
    ['NaN in an array', { a: [1, Number.NaN] }],
    ['Infinity in a table', { t: { n: -Infinity } }],
    ['a table with a field named !', { t: { '!': 'x' } }],
    ['a table with a field named hasOwnProperty', { t: { hasOwnProperty: 'x' } }],
    ['a 256-byte field name in a table', { t: { ['k'.repeat(256)]: 1 } }],
    ['undefined in an array', { a: ['x', undefined] }],
    ['a bigint', { n: BigInt(1) }],
    ['a table without a prototype', { t: Object.assign(Object.create(null) as object, { a: 1 }) }],
    ['a typed value of a type amqplib does not know', { t: { '!': 'uuid', value: 'x' } }],
    ['a typed timestamp that is negative', { t: { '!': 'timestamp', value: -1 } }],
    ['a typed byte out of range', { t: { '!': 'int8', value: 200 } }],
    ['a decimal without digits', { t: { '!': 'decimal', value: { places: 2 } } }],
  ])('refuses %s, which amqplib fails to encode', (_what, headers) => {
    expect(() => amqplibEncodes(headers)).toThrow();
    expect(() => assertEncodableHeaders('orders', headers)).toThrow(InvalidHeaderError);
  });

  it('refuses Infinity too (amqplib would send it as a double; no header means it)', () => {
    expect(() => assertEncodableHeaders('orders', { n: Infinity })).toThrow(/not a finite number/);
  });

  it('refuses headers too large for the scratch buffer, which amqplib would truncate silently', () => {
    const headers = { big: 'x'.repeat(70_000) };
    // No throw from amqplib: it reports a size its 64 KiB buffer cannot hold.
    expect(amqplibEncodes(headers)).toBeGreaterThan(64 * 1024);
    expect(() => assertEncodableHeaders('orders', headers)).toThrow(
      new RegExp(`at most ${MAX_ENCODED_HEADER_BYTES}`),
    );
  });

  it('accepts what amqplib encodes, up to the limit', () => {
    const headers: Record<string, unknown> = {
      small: 1,
      fraction: -1.5,
      big: 2 ** 53,
      huge: 2 ** 64,
      smallest: -(2 ** 63),
      text: 'é'.repeat(1_000),
      flag: false,
      ['n'.repeat(255)]: 'max name',
      death: [{ count: 1, reason: 'rejected', queue: 'orders' }],
    };
    expect(() => assertEncodableHeaders('orders', headers)).not.toThrow();
    expect(amqplibEncodes(headers)).toBeLessThan(64 * 1024);
    const nearLimit = { big: 'x'.repeat(MAX_ENCODED_HEADER_BYTES - 10) };
    expect(() => assertEncodableHeaders('orders', nearLimit)).not.toThrow();
    expect(amqplibEncodes(nearLimit)).toBeLessThan(64 * 1024);
  });

  it('names the header and the channel in the error', () => {
    expect(() => assertEncodableHeaders('orders', { retries: Number.NaN })).toThrow(
      'a message to orders cannot be sent: header retries is NaN, not a finite number',
    );
  });
});

/** Headers as amqplib decodes them from RabbitMQ, typed values included. */
const decoded = {
  'x-death': [
    {
      count: 1,
      reason: 'rejected',
      queue: 'orders',
      time: { '!': 'timestamp', value: 1_796_000_000 },
      exchange: '',
      'routing-keys': ['orders'],
    },
  ],
  price: { '!': 'decimal', value: { places: 2, digits: 1999 } },
  when: { '!': 'timestamp', value: 0 },
  bytes: Buffer.from('raw'),
  nothing: null,
  small: -3,
  wide: 70_000,
  huge: 2 ** 40,
  fraction: 0.5,
  flag: true,
  nested: { a: [1, 'two', { b: [] }], c: {} },
};

describe('encodedHeaders: the size amqplib writes, exactly', () => {
  it.each<[string, Record<string, unknown>]>([
    ['headers as RabbitMQ delivers them', decoded],
    [
      '15,000 empty strings (their JSON is shorter than their encoding)',
      { a: Array(15_000).fill('') },
    ],
    ['15,000 halves (doubles: 9 bytes each)', { a: Array(15_000).fill(0.5) }],
    ['empty tables and arrays', { a: [], t: {}, n: [[], [{}]] }],
    ['every integer width', { a: [1, -200, 40_000, -(2 ** 31), 2 ** 33, 2 ** 53] }],
  ])('for %s', (_what, headers) => {
    expect(encodedHeaders(headers)).toEqual({
      bytes: encodeTable(Buffer.alloc(256 * 1024), headers, 0),
    });
  });

  it('refuses what is past the limit by the exact size, whatever JSON would say', () => {
    const halves = { a: Array(7_000).fill(0.5) }; // ~28 KB of JSON, 63 KB encoded
    expect(() => assertEncodableHeaders('orders', halves)).toThrow(/at most/);
  });
});

describe('forwardableHeaders (a dead letter or requeued copy of a message from elsewhere)', () => {
  it('returns headers amqplib encodes as they are, typed values (timestamps, decimals) included', () => {
    expect(forwardableHeaders(decoded)).toBe(decoded);
    expect(() => assertEncodableHeaders('orders.dlq', decoded)).not.toThrow();
  });

  it('replaces each value amqplib cannot encode with a string saying why, and keeps the rest', () => {
    const headers = {
      'x-sequence-id': 'seq-1',
      nan: [Number.NaN],
      bang: { '!': 'x' },
      own: { hasOwnProperty: 'x' },
      // Types and values String() cannot convert (another program's JSON header, say).
      typeless: { '!': { toString: 1 } },
      valueless: { '!': 'int', value: { toString: 1 } },
    };

    const forwarded = forwardableHeaders(headers);

    expect(forwarded).toEqual({
      'x-sequence-id': 'seq-1',
      nan: expect.stringMatching(/^\(not forwarded: holds a value at \[0\] that is NaN/) as string,
      bang: expect.stringMatching(/typed value of type x/) as string,
      own: expect.stringMatching(/without a hasOwnProperty method/) as string,
      typeless: expect.stringMatching(/typed value of type \{"toString":1\}/) as string,
      valueless: expect.stringMatching(/is a int of \{"toString":1\}, out of its range/) as string,
    });
    expect(() => assertEncodableHeaders('orders.dlq', forwarded)).not.toThrow();
    expect(amqplibEncodes(forwarded)).toBeLessThan(64 * 1024);
  });

  it('leaves out the largest values while the whole is too large, never those it must keep, and names them', () => {
    const headers = {
      first: 'a'.repeat(40_000),
      second: 'b'.repeat(30_000),
      small: 'c',
      'x-death-reason': 'r'.repeat(20_000),
      ['k'.repeat(256)]: 'a name AMQP cannot carry',
    };

    const forwarded = forwardableHeaders(headers, ['x-death-reason']);

    expect(forwarded).toEqual({
      second: headers.second,
      small: 'c',
      'x-death-reason': headers['x-death-reason'],
      [DROPPED_HEADERS_HEADER]: `${'k'.repeat(40)}…,first`,
    });
    expect(() => assertEncodableHeaders('orders.dlq', forwarded)).not.toThrow();
  });

  it('adds to the names an earlier forward left out', () => {
    const forwarded = forwardableHeaders({
      [DROPPED_HEADERS_HEADER]: 'first',
      second: 's'.repeat(70_000),
    });
    expect(forwarded).toEqual({ [DROPPED_HEADERS_HEADER]: 'first,second' });
  });
});

describe('droppedHeadersList', () => {
  it('adds the names to an earlier list, comma-separated', () => {
    expect(droppedHeadersList('a', ['b', 'c'])).toBe('a,b,c');
    expect(droppedHeadersList(undefined, ['b'])).toBe('b');
    expect(droppedHeadersList(7, [])).toBe('');
  });

  it('keeps whole names only, within 1,000 characters', () => {
    const earlier = 'e'.repeat(992);
    expect(droppedHeadersList(earlier, ['x-1', 'x-foreign'])).toBe(`${earlier},x-1`);
    expect(droppedHeadersList('e'.repeat(2_000), ['x-1']).length).toBe(1_000);
  });
});
