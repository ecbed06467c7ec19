import { randomBytes } from 'node:crypto';
import { BodyCipher, sequenceBodyIdentity } from './body-cipher';
import { SequenceOptionsError } from './errors/sequence-options.error';
import { SealedBufferFailure } from './sealed-buffer';

const A = { id: 'a', key: randomBytes(32) };
const B = { id: 'b', key: randomBytes(32) };
const REF = { scope: 'orders', sequenceId: 's-1' };

function failureOf(open: () => unknown): SealedBufferFailure {
  try {
    open();
  } catch (error) {
    if (error instanceof SealedBufferFailure) return error;
    throw error;
  }
  throw new Error('expected the value not to open');
}

describe('BodyCipher', () => {
  const cipher = new BodyCipher({ keys: [A] }, 'test store encryption');
  const plaintext = Buffer.from('patient: Jane Doe; '.repeat(50));
  const identity = sequenceBodyIdentity(REF, 3);

  it('seals a value into 98 more bytes that hold none of the plaintext, and opens it', () => {
    const sealed = cipher.seal(plaintext, identity);

    expect(sealed.length).toBe(plaintext.length + BodyCipher.overheadBytes);
    expect(BodyCipher.overheadBytes).toBe(98);
    expect(sealed.includes('Jane Doe')).toBe(false);
    expect(cipher.open(sealed, identity)).toEqual(plaintext);
  });

  it('seals the same value differently every time (a fresh IV each)', () => {
    expect(cipher.seal(plaintext, identity)).not.toEqual(cipher.seal(plaintext, identity));
  });

  it('opens a value only under the identity it was sealed with', () => {
    const sealed = cipher.seal(plaintext, identity);

    for (const other of [
      sequenceBodyIdentity(REF, 4),
      sequenceBodyIdentity({ ...REF, sequenceId: 's-2' }, 3),
      sequenceBodyIdentity({ ...REF, scope: 'billing' }, 3),
    ]) {
      expect(failureOf(() => cipher.open(sealed, other)).reason).toBe('authentication-failed');
    }
  });

  it('never opens a value with any one byte altered', () => {
    const sealed = cipher.seal(Buffer.from('a small body'), identity);
    const opened: number[] = [];

    for (let offset = 0; offset < sealed.length; offset++) {
      const altered = Buffer.from(sealed);
      altered[offset] ^= 0x01;
      try {
        cipher.open(altered, identity);
        opened.push(offset);
      } catch (error) {
        expect(error).toBeInstanceOf(SealedBufferFailure);
      }
    }

    expect(opened).toEqual([]);
  });

  it('opens a value sealed in parts of any size, releasing plaintext before the end', () => {
    const sealed = cipher.seal(plaintext, identity);
    const opener = cipher.opener(identity);
    const parts: Buffer[] = [];

    for (let offset = 0; offset < sealed.length; offset += 7) {
      parts.push(...opener.update(sealed.subarray(offset, offset + 7)));
    }
    const beforeTag = Buffer.concat(parts).length;
    parts.push(...opener.final());

    expect(beforeTag).toBeGreaterThan(0);
    expect(Buffer.concat(parts)).toEqual(plaintext);
  });

  it('reports a value cut short as truncated', () => {
    const sealed = cipher.seal(plaintext, identity);

    expect(failureOf(() => cipher.open(sealed.subarray(0, 90), identity)).reason).toBe('truncated');
  });

  it('reports a value cut short inside its header as truncated', () => {
    const sealed = cipher.seal(plaintext, identity);

    for (const length of [2, 5, 40]) {
      expect(failureOf(() => cipher.open(sealed.subarray(0, length), identity)).reason).toBe(
        'truncated',
      );
    }
  });

  it('reports nothing at all as malformed-header: what an empty plaintext stored before gives', () => {
    // A sequence without user headers keeps "{}", which an encrypting store decodes to no bytes;
    // an empty body is none either. A sealed value is never that short.
    expect(failureOf(() => cipher.open(Buffer.alloc(0), identity)).reason).toBe('malformed-header');
  });

  it('reports plaintext shorter than a header, stored before encryption, as malformed-header', () => {
    const stored = Buffer.from('{"plain":true}');

    expect(failureOf(() => cipher.open(stored, identity)).reason).toBe('malformed-header');
  });

  it('opens values sealed under a retired key while sealing under the new one (rotation)', () => {
    const old = cipher.seal(plaintext, identity);
    const rotated = new BodyCipher({ keys: [B, A] }, 'test store encryption');
    const fresh = rotated.seal(plaintext, identity);

    expect(rotated.open(old, identity)).toEqual(plaintext);
    expect(rotated.encryptionKeyId).toBe('b');
    expect(failureOf(() => cipher.open(fresh, identity))).toMatchObject({
      reason: 'unknown-key',
      keyId: 'b',
    });
  });

  it('refuses keys that are not 32 bytes, naming the option', () => {
    const build = () => new BodyCipher({ keys: [{ id: 'k', key: randomBytes(16) }] }, 'X store');

    expect(build).toThrow(SequenceOptionsError);
    expect(build).toThrow(/invalid X store keys:\n {2}- key "k": key must be 32 bytes/);
  });
});
