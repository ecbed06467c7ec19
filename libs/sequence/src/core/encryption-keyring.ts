import { createCipheriv, createDecipheriv, type CipherGCM, type DecipherGCM } from 'node:crypto';
import type { PayloadEncryptionKey } from './encryption-key';
import { SequenceOptionsError } from './errors/sequence-options.error';
import { isPlainObject, kindOf } from './option-keys';

export const PAYLOAD_KEY_BYTES = 32;
export const PAYLOAD_KEY_ID_PATTERN = /^[A-Za-z0-9._:-]{1,64}$/;
export const GCM_IV_BYTES = 12;
export const GCM_TAG_BYTES = 16;
const ALGORITHM = 'aes-256-gcm';
/** 32 bytes in base64: 43 characters plus one `=` of padding (optional, and absent in base64url). */
const BASE64_OF_32_BYTES = /^(?:[A-Za-z0-9+/]{43}=?|[A-Za-z0-9_-]{43})$/;

/**
 * What is wrong with encryption options (`{ keys }`, for a keyring) given as something that is
 * not an object at all, or undefined when they are one: the keys inside are the keyring's to
 * check.
 */
export function keysObjectProblem(options: unknown): string | undefined {
  if (isPlainObject(options)) return undefined;
  return `must be an object: { keys: [{ id, key }] }, got ${kindOf(options)}`;
}

/**
 * The validated payload encryption keys: the first encrypts, every one decrypts, so keys rotate
 * (put the new key first; keep the old one listed while payloads encrypted under it remain).
 * Key material is copied and kept in a private field, out of sight of `JSON.stringify`,
 * `util.inspect` and loggers.
 */
export class EncryptionKeyring {
  /** The id of the key new payloads are encrypted with. */
  readonly encryptionKeyId: string;
  readonly #keys: ReadonlyMap<string, Buffer>;

  /**
   * @param where names the option in the error (`SequenceOptionsError.where`).
   * @throws SequenceOptionsError listing every problem with the keys at once.
   */
  constructor(keys: readonly PayloadEncryptionKey[], where = 'payload encryption keys') {
    const problems: string[] = [];
    const material = new Map<string, Buffer>();
    if (!Array.isArray(keys) || keys.length === 0) {
      problems.push('give at least one key: { id, key } (the first encrypts, all decrypt)');
    } else {
      keys.forEach((entry: Partial<PayloadEncryptionKey> | undefined, index) => {
        const id: unknown = entry?.id;
        const label = typeof id === 'string' ? `key ${JSON.stringify(id)}` : `key #${index + 1}`;
        if (typeof id !== 'string' || !PAYLOAD_KEY_ID_PATTERN.test(id)) {
          problems.push(`${label}: id must be 1-64 characters of [A-Za-z0-9._:-]`);
        } else if (material.has(id)) {
          problems.push(`${label}: the id is used twice; each key needs its own id`);
        }
        const key = keyBytes(entry?.key);
        if (key === undefined) {
          problems.push(
            `${label}: key must be ${PAYLOAD_KEY_BYTES} bytes, as a Buffer or as base64 ` +
              '(e.g. `openssl rand -base64 32`)',
          );
        }
        if (typeof id === 'string' && key !== undefined && !material.has(id)) {
          material.set(id, key);
        }
      });
    }
    if (problems.length > 0) throw new SequenceOptionsError(where, problems);
    this.#keys = material;
    this.encryptionKeyId = [...material.keys()][0];
  }

  /** An AES-256-GCM cipher under the encryption key. `iv` must never repeat for that key. */
  createCipher(iv: Buffer): CipherGCM {
    const key = this.#keys.get(this.encryptionKeyId) as Buffer;
    return createCipheriv(ALGORITHM, key, iv, { authTagLength: GCM_TAG_BYTES });
  }

  /** A decipher under the key `keyId`; `undefined` when no key has that id. */
  createDecipher(keyId: string, iv: Buffer): DecipherGCM | undefined {
    const key = this.#keys.get(keyId);
    return key && createDecipheriv(ALGORITHM, key, iv, { authTagLength: GCM_TAG_BYTES });
  }
}

function keyBytes(key: unknown): Buffer | undefined {
  if (Buffer.isBuffer(key)) return key.length === PAYLOAD_KEY_BYTES ? Buffer.from(key) : undefined;
  if (typeof key === 'string' && BASE64_OF_32_BYTES.test(key)) {
    const decoded = Buffer.from(key, 'base64');
    return decoded.length === PAYLOAD_KEY_BYTES ? decoded : undefined;
  }
  return undefined;
}
