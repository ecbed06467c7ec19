import { strictUtf8 } from './unicode';

describe('strictUtf8', () => {
  const bom = Buffer.from([0xef, 0xbb, 0xbf]);

  it('decodes valid UTF-8', () => {
    expect(strictUtf8(Buffer.from('{"id":"é-€-😀"}', 'utf8'))).toBe('{"id":"é-€-😀"}');
    expect(strictUtf8(new Uint8Array())).toBe('');
  });

  it('gives undefined for bytes that are not UTF-8, rather than U+FFFD', () => {
    expect(strictUtf8(Buffer.from([0x61, 0xff, 0x62]))).toBeUndefined();
    // A truncated sequence, an overlong encoding and an encoded surrogate.
    expect(strictUtf8(Buffer.from([0x61, 0xe2, 0x82]))).toBeUndefined();
    expect(strictUtf8(Buffer.from([0xc0, 0xaf]))).toBeUndefined();
    expect(strictUtf8(Buffer.from([0xed, 0xa0, 0x80]), { keepBom: true })).toBeUndefined();
  });

  it('drops a leading byte order mark by default', () => {
    expect(strictUtf8(Buffer.concat([bom, Buffer.from('T1')]))).toBe('T1');
  });

  it('keeps a leading byte order mark as U+FEFF when asked', () => {
    expect(strictUtf8(Buffer.concat([bom, Buffer.from('T1')]), { keepBom: true })).toBe('\uFEFFT1');
  });

  it('keeps a byte order mark that does not lead, either way', () => {
    const inner = Buffer.concat([Buffer.from('T'), bom, Buffer.from('1')]);
    expect(strictUtf8(inner)).toBe('T\uFEFF1');
    expect(strictUtf8(inner, { keepBom: true })).toBe('T\uFEFF1');
  });

  it('keeps no state between calls', () => {
    expect(strictUtf8(Buffer.from([0xe2, 0x82]))).toBeUndefined();
    expect(strictUtf8(Buffer.from([0xac]))).toBeUndefined();
    expect(strictUtf8(Buffer.concat([bom, Buffer.from('a')]))).toBe('a');
    expect(strictUtf8(Buffer.concat([bom, Buffer.from('b')]))).toBe('b');
  });
});
