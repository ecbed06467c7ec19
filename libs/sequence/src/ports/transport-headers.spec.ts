import { InvalidHeaderError } from '../core/errors/invalid-header.error';
import { assertEncodableHeaders, MAX_ENCODED_HEADER_BYTES } from './transport-headers';

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
