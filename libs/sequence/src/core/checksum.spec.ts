import { crc32, crc32Continued, sha256Hasher, sha256Hex } from './checksum';

describe('crc32', () => {
  it('matches the CRC-32/IEEE check value for "123456789"', () => {
    expect(crc32(Buffer.from('123456789'))).toBe(0xcbf43926);
  });

  it('is 0 for an empty body', () => {
    expect(crc32(Buffer.alloc(0))).toBe(0);
  });

  it('is unsigned even when the top bit is set', () => {
    // 0xcbf43926 has its top bit set: a signed result would be negative.
    expect(crc32(Buffer.from('123456789'))).toBeGreaterThan(0x7fffffff);
  });

  it('reads a plain Uint8Array like a Buffer', () => {
    expect(crc32(new Uint8Array(Buffer.from('123456789')))).toBe(0xcbf43926);
  });

  it('covers only the bytes of a view, not its whole backing buffer', () => {
    const backing = Buffer.from('xx123456789yy');

    expect(crc32(backing.subarray(2, 11))).toBe(0xcbf43926);
  });
});

describe('crc32Continued', () => {
  it('over the pieces of a body, gives the CRC-32 of the whole body', () => {
    const body = Buffer.from('123456789');
    const running = crc32Continued(body.subarray(4), crc32Continued(body.subarray(0, 4), 0));
    expect(running).toBe(0xcbf43926);
    expect(crc32Continued(body, 0)).toBe(crc32(body));
  });
});

describe('sha256Hex', () => {
  it('matches the FIPS 180-2 vector for "abc", in lowercase hex', () => {
    expect(sha256Hex(Buffer.from('abc'))).toBe(
      'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad',
    );
  });

  it('matches the known digest of an empty payload', () => {
    expect(sha256Hex(Buffer.alloc(0))).toBe(
      'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
    );
  });
});

describe('sha256Hasher', () => {
  it('gives the digest of the whole payload when fed in pieces', () => {
    const hasher = sha256Hasher();
    for (const piece of ['a', '', 'b', 'c']) hasher.update(Buffer.from(piece));

    expect(hasher.digest('hex')).toBe(sha256Hex(Buffer.from('abc')));
  });
});
