import { sha256Hex } from './checksum';
import { MalformedFragmentError } from './errors/malformed-fragment.error';
import {
  buildFragmentHeaders,
  isContractHeader,
  parseFragmentHeaders,
  SequenceHeader,
  type FragmentHeaderInput,
} from './headers';

const PAYLOAD_SHA256 = sha256Hex(Buffer.from('the whole payload'));

/** A valid middle fragment (2 of 3); `overrides` set to undefined remove a header. */
function middleFragment(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    [SequenceHeader.version]: 1,
    [SequenceHeader.id]: 'order-42',
    [SequenceHeader.position]: 2,
    [SequenceHeader.size]: 3,
    [SequenceHeader.crc32]: 0xcbf43926,
    ...overrides,
  };
}

/** A valid last fragment (3 of 3). */
function lastFragment(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return middleFragment({
    [SequenceHeader.position]: 3,
    [SequenceHeader.last]: true,
    [SequenceHeader.sha256]: PAYLOAD_SHA256,
    ...overrides,
  });
}

/** The error `parseFragmentHeaders` throws; fails the test if it throws nothing or another type. */
function rejection(headers: Record<string, unknown>): MalformedFragmentError {
  try {
    parseFragmentHeaders(headers);
  } catch (error) {
    if (error instanceof MalformedFragmentError) return error;
    throw error;
  }
  throw new Error('expected the headers to be rejected');
}

describe('buildFragmentHeaders → parseFragmentHeaders', () => {
  it('round-trips the last fragment of a sized sequence', () => {
    const input: FragmentHeaderInput = {
      sequenceId: 'transfer:2026-11.a_b-c',
      position: 5,
      size: 5,
      last: true,
      crc32: 0xffffffff,
      sha256: PAYLOAD_SHA256,
      bytes: 4_096,
      contentType: 'application/x-ndjson',
      contentEncoding: 'gzip',
      userHeaders: { tenant: 'acme', priority: 3, urgent: false },
    };

    expect(parseFragmentHeaders(buildFragmentHeaders(input))).toEqual(input);
  });

  it('round-trips a streamed fragment whose size is not known yet', () => {
    const input: FragmentHeaderInput = {
      sequenceId: 'stream-1',
      position: 7,
      last: false,
      crc32: 0,
      userHeaders: {},
    };

    const parsed = parseFragmentHeaders(buildFragmentHeaders(input));

    expect(parsed).toMatchObject({ sequenceId: 'stream-1', position: 7, last: false, crc32: 0 });
    expect(parsed.size).toBeUndefined();
    expect(parsed.sha256).toBeUndefined();
  });

  it('stamps version 1 on every fragment', () => {
    const headers = buildFragmentHeaders({ sequenceId: 's', position: 1, last: false, crc32: 1 });

    expect(headers[SequenceHeader.version]).toBe(1);
  });
});

describe('parseFragmentHeaders accepts', () => {
  it('numbers and booleans sent as decimal strings', () => {
    const parsed = parseFragmentHeaders(
      lastFragment({
        [SequenceHeader.version]: '1',
        [SequenceHeader.position]: '3',
        [SequenceHeader.size]: '3',
        [SequenceHeader.crc32]: '4294967295',
        [SequenceHeader.bytes]: '0',
        [SequenceHeader.last]: 'true',
      }),
    );

    expect(parsed).toMatchObject({ position: 3, size: 3, crc32: 4294967295, bytes: 0, last: true });
  });

  it('a numeric -0, as a JSON-typed header may carry it, as 0', () => {
    const parsed = parseFragmentHeaders(lastFragment({ [SequenceHeader.bytes]: -0 }));

    expect(Object.is(parsed.bytes, 0)).toBe(true);
  });

  it('Buffer-valued headers, as amqplib may deliver them, read as strings', () => {
    const parsed = parseFragmentHeaders(
      lastFragment({
        [SequenceHeader.id]: Buffer.from('order-42'),
        [SequenceHeader.sha256]: Buffer.from(PAYLOAD_SHA256),
        tenant: Buffer.from('acme'),
      }),
    );

    expect(parsed.sequenceId).toBe('order-42');
    expect(parsed.sha256).toBe(PAYLOAD_SHA256);
    expect(parsed.userHeaders.tenant).toBe('acme');
  });

  it('an id of exactly 128 characters', () => {
    const id = 'a'.repeat(128);

    expect(parseFragmentHeaders(middleFragment({ [SequenceHeader.id]: id })).sequenceId).toBe(id);
  });

  it('an uppercase SHA-256, normalized to lowercase', () => {
    const parsed = parseFragmentHeaders(
      lastFragment({ [SequenceHeader.sha256]: PAYLOAD_SHA256.toUpperCase() }),
    );

    expect(parsed.sha256).toBe(PAYLOAD_SHA256);
  });

  it('a fragment without x-sequence-last as not last', () => {
    expect(parseFragmentHeaders(middleFragment()).last).toBe(false);
  });
});

describe('parseFragmentHeaders separates user headers', () => {
  it('passes the producer’s own headers through to userHeaders', () => {
    const parsed = parseFragmentHeaders(middleFragment({ tenant: 'acme', retries: 2 }));

    expect(parsed.userHeaders).toEqual({ tenant: 'acme', retries: 2 });
  });

  it('keeps x-claim-check (a fragment sent via claim check) out of userHeaders', () => {
    const parsed = parseFragmentHeaders(middleFragment({ 'x-claim-check': 1, tenant: 'acme' }));

    expect(parsed.userHeaders).toEqual({ tenant: 'acme' });
  });

  it('keeps trace context headers out of userHeaders (the receiver reads them from the message)', () => {
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    const parsed = parseFragmentHeaders(
      middleFragment({
        traceparent,
        tracestate: 'vendor=1',
        'x-message-traceparent': traceparent,
        'X-Message-Tracestate': 'vendor=1',
        tenant: 'acme',
      }),
    );

    expect(parsed.userHeaders).toEqual({ tenant: 'acme' });
  });

  it('keeps contract headers out of userHeaders', () => {
    const parsed = parseFragmentHeaders(lastFragment({ [SequenceHeader.bytes]: 10 }));

    expect(Object.keys(parsed.userHeaders).filter(isContractHeader)).toEqual([]);
    expect(parsed.userHeaders).toEqual({});
  });

  it('puts content-type and content-encoding in their own fields, not in userHeaders', () => {
    const parsed = parseFragmentHeaders(
      middleFragment({
        [SequenceHeader.contentType]: 'image/png',
        [SequenceHeader.contentEncoding]: 'br',
      }),
    );

    expect(parsed.contentType).toBe('image/png');
    expect(parsed.contentEncoding).toBe('br');
    expect(parsed.userHeaders).toEqual({});
  });
});

describe('parseFragmentHeaders rejects', () => {
  it('a missing id', () => {
    expect(rejection(middleFragment({ [SequenceHeader.id]: undefined }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.id,
    });
  });

  it.each([
    ['a slash', 'a/b'],
    ['a space', 'a b'],
    ['129 characters', 'a'.repeat(129)],
    ['no characters', ''],
  ])('an id with %s', (_, id) => {
    expect(rejection(middleFragment({ [SequenceHeader.id]: id }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.id,
    });
  });

  it.each([
    ['missing', undefined],
    ['"1.5"', '1.5'],
    ['1.5', 1.5],
    ['-1', -1],
    ['0', 0],
    ['"abc"', 'abc'],
    ['" 2" (not canonical)', ' 2'],
  ])('a position that is %s', (_, position) => {
    expect(rejection(middleFragment({ [SequenceHeader.position]: position }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.position,
      sequenceId: 'order-42',
    });
  });

  it('a size of 0', () => {
    expect(rejection(middleFragment({ [SequenceHeader.size]: 0 }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.size,
    });
  });

  it('a position beyond the size', () => {
    const error = rejection(
      middleFragment({ [SequenceHeader.position]: 4, [SequenceHeader.size]: 3 }),
    );

    expect(error).toMatchObject({ code: 'malformed-header', header: SequenceHeader.position });
  });

  it('a last fragment without a size', () => {
    expect(rejection(lastFragment({ [SequenceHeader.size]: undefined }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.size,
    });
  });

  it('a last fragment at a position other than the size', () => {
    expect(rejection(lastFragment({ [SequenceHeader.position]: 2 }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.last,
    });
  });

  it('a last fragment without a SHA-256', () => {
    expect(rejection(lastFragment({ [SequenceHeader.sha256]: undefined }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.sha256,
    });
  });

  it.each([
    ['too short', 'abc123'],
    ['not hexadecimal', 'g'.repeat(64)],
    ['one character too long', `${PAYLOAD_SHA256}0`],
    ['a number', 42],
  ])('a SHA-256 that is %s', (_, sha256) => {
    expect(rejection(lastFragment({ [SequenceHeader.sha256]: sha256 }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.sha256,
    });
  });

  it.each([
    ['above 2^32-1', 2 ** 32],
    ['negative', -1],
    ['missing', undefined],
  ])('a CRC-32 that is %s', (_, crc32) => {
    expect(rejection(middleFragment({ [SequenceHeader.crc32]: crc32 }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.crc32,
    });
  });

  it.each([undefined, null])('headers that are %p (a message published without any)', (headers) => {
    expect(rejection(headers as never)).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.id,
    });
  });

  it('a byte count of "-0" (not canonical)', () => {
    expect(rejection(middleFragment({ [SequenceHeader.bytes]: '-0' }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.bytes,
    });
  });

  it('a negative byte count', () => {
    expect(rejection(middleFragment({ [SequenceHeader.bytes]: -1 }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.bytes,
    });
  });

  it('a missing version as a malformed header', () => {
    expect(rejection(middleFragment({ [SequenceHeader.version]: undefined }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.version,
    });
  });

  it('version 2 as an unsupported version, naming the sequence', () => {
    expect(rejection(middleFragment({ [SequenceHeader.version]: 2 }))).toMatchObject({
      code: 'unsupported-version',
      header: SequenceHeader.version,
      sequenceId: 'order-42',
    });
  });

  it('a last flag that is not a boolean', () => {
    expect(rejection(lastFragment({ [SequenceHeader.last]: 'maybe' }))).toMatchObject({
      code: 'malformed-header',
      header: SequenceHeader.last,
    });
  });

  it.each([SequenceHeader.contentType, SequenceHeader.contentEncoding])(
    'a %s longer than 255 characters, or not printable ASCII (kept with the sequence until it ends)',
    (header) => {
      for (const value of ['x'.repeat(256), 'image/png\n', 'text/plain; name=é']) {
        expect(rejection(middleFragment({ [header]: value }))).toMatchObject({
          code: 'malformed-header',
          header,
          sequenceId: 'order-42',
        });
      }
      expect(parseFragmentHeaders(middleFragment({ [header]: 'x'.repeat(255) }))).toBeDefined();
      // Empty, as some clients send it: absent.
      expect(parseFragmentHeaders(middleFragment({ [header]: '' }))).not.toHaveProperty(
        header === SequenceHeader.contentType ? 'contentType' : 'contentEncoding',
        expect.anything(),
      );
    },
  );

  it('with an error whose message names the header and the sequence', () => {
    const error = rejection(middleFragment({ [SequenceHeader.size]: 0 }));

    expect(error.name).toBe('MalformedFragmentError');
    expect(error.message).toContain(SequenceHeader.size);
    expect(error.message).toContain('order-42');
  });

  it('rejects the fragment at position = size without x-sequence-last (the contract sets it there)', () => {
    const headers = buildFragmentHeaders({
      sequenceId: 'no-last',
      position: 3,
      size: 3,
      last: false,
      crc32: 1,
      sha256: 'a'.repeat(64),
    });
    let thrown: unknown;
    try {
      parseFragmentHeaders(headers);
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(MalformedFragmentError);
    expect(thrown).toMatchObject({ code: 'malformed-header', header: 'x-sequence-last' });
  });

  it('keeps transport metadata (dead-lettering, delivery and requeue counts) out of user headers', () => {
    const headers = {
      ...buildFragmentHeaders({ sequenceId: 't', position: 1, size: 2, last: false, crc32: 1 }),
      'x-requeue-count': 2,
      'x-delivery-count': 1,
      'x-first-death-reason': 'rejected',
      'x-death-reason': 'crc-mismatch: …',
      tenant: 'acme',
    };
    expect(parseFragmentHeaders(headers).userHeaders).toEqual({ tenant: 'acme' });
  });
});
