import { createHash, type Hash } from 'node:crypto';
import { crc32 as zlibCrc32 } from 'node:zlib';

/** CRC-32 (IEEE, as `zlib.crc32`) of one fragment body, as an unsigned 32-bit integer. */
export function crc32(body: Uint8Array): number {
  return crc32Continued(body, 0);
}

/** CRC-32 of a body that arrives in pieces: pass the previous piece's result as `running`. */
export function crc32Continued(piece: Uint8Array, running: number): number {
  return zlibCrc32(piece, running) >>> 0;
}

/** A running SHA-256 of a payload that arrives in pieces. */
export function sha256Hasher(): Hash {
  return createHash('sha256');
}

/** SHA-256 of a whole buffer, lowercase hex. */
export function sha256Hex(payload: Uint8Array): string {
  return createHash('sha256').update(payload).digest('hex');
}
