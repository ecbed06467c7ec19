/*
 * How an encrypted payload, or one encrypted body of a store, is laid out at rest (format
 * version 1):
 *
 *   offset  bytes  field
 *   0       4      magic, ASCII "NSQE"
 *   4       1      format version, 1
 *   5       1      key id length n, 1-64
 *   6       64     key id, ASCII: n bytes, then zeros
 *   70      12     IV, random per payload
 *   82      P      ciphertext, as long as the plaintext (GCM is a stream mode)
 *   82+P    16     GCM authentication tag
 *
 * The 82 header bytes are the GCM additional authenticated data: a change to any of them fails
 * the tag even where parsing would let it through. A store body adds its identity after the
 * header (see core/sealed-buffer.ts `context`), so it opens only where it was stored; a payload
 * adds nothing, so payloads stay readable as they were written. The key id field has a fixed
 * size so that the overhead is a constant: the plaintext size is the stored size minus 98, and
 * `head` can tell it without reading the payload.
 */
import { GCM_IV_BYTES, GCM_TAG_BYTES, PAYLOAD_KEY_ID_PATTERN } from './encryption-keyring';

const MAGIC = Buffer.from('NSQE', 'ascii');
export const PAYLOAD_FORMAT_VERSION = 1;
const KEY_ID_FIELD_BYTES = 64;
const VERSION_OFFSET = MAGIC.length;
const KEY_ID_LENGTH_OFFSET = VERSION_OFFSET + 1;
const KEY_ID_OFFSET = KEY_ID_LENGTH_OFFSET + 1;
const IV_OFFSET = KEY_ID_OFFSET + KEY_ID_FIELD_BYTES;

/** Bytes before the ciphertext. */
export const HEADER_BYTES = IV_OFFSET + GCM_IV_BYTES;
/** Bytes an encrypted payload takes beyond its plaintext. */
export const ENCRYPTION_OVERHEAD_BYTES = HEADER_BYTES + GCM_TAG_BYTES;

export interface PayloadHeader {
  readonly keyId: string;
  readonly iv: Buffer;
}

/** The header of a payload encrypted under `keyId` with `iv`. */
export function encodeHeader({ keyId, iv }: PayloadHeader): Buffer {
  const header = Buffer.alloc(HEADER_BYTES);
  MAGIC.copy(header, 0);
  header[VERSION_OFFSET] = PAYLOAD_FORMAT_VERSION;
  header[KEY_ID_LENGTH_OFFSET] = header.write(keyId, KEY_ID_OFFSET, KEY_ID_FIELD_BYTES, 'ascii');
  iv.copy(header, IV_OFFSET);
  return header;
}

/**
 * Whether `bytes`, shorter than a header, may be the start of one: the magic and the version as
 * far as they go. False for plaintext stored before encryption was turned on, however short.
 */
export function mayStartHeader(bytes: Buffer): boolean {
  const magic = bytes.subarray(0, MAGIC.length);
  if (!magic.equals(MAGIC.subarray(0, magic.length))) return false;
  return bytes.length <= VERSION_OFFSET || bytes[VERSION_OFFSET] === PAYLOAD_FORMAT_VERSION;
}

/**
 * Reads the first {@link HEADER_BYTES} bytes of a stored payload; `undefined` when they are not
 * a header of this format (other magic or version, a key id of another shape, padding not zero).
 */
export function parseHeader(header: Buffer): PayloadHeader | undefined {
  if (header.length !== HEADER_BYTES) return undefined;
  if (!header.subarray(0, MAGIC.length).equals(MAGIC)) return undefined;
  if (header[VERSION_OFFSET] !== PAYLOAD_FORMAT_VERSION) return undefined;
  const keyIdLength = header[KEY_ID_LENGTH_OFFSET];
  if (keyIdLength < 1 || keyIdLength > KEY_ID_FIELD_BYTES) return undefined;
  const keyIdEnd = KEY_ID_OFFSET + keyIdLength;
  const keyId = header.toString('latin1', KEY_ID_OFFSET, keyIdEnd);
  if (!PAYLOAD_KEY_ID_PATTERN.test(keyId)) return undefined;
  if (header.subarray(keyIdEnd, IV_OFFSET).some((byte) => byte !== 0)) return undefined;
  return { keyId, iv: Buffer.from(header.subarray(IV_OFFSET, HEADER_BYTES)) };
}
