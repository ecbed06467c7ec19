import { crc32 } from '../../src/core/checksum';
import type { TestFragment } from './sequence-test-app';

/** The CRC-32 (IEEE, reflected) table: entry i is the register after shifting byte i through. */
const TABLE = Array.from({ length: 256 }, (_, index) => {
  let register = index;
  for (let bit = 0; bit < 8; bit++) {
    register = register & 1 ? (register >>> 1) ^ 0xedb88320 : register >>> 1;
  }
  return register >>> 0;
});

/** The table entry whose top byte is the key (the top bytes of the 256 entries differ). */
const BY_TOP_BYTE = new Map(TABLE.map((entry, index) => [entry >>> 24, index]));

/**
 * `body` with its last 4 bytes replaced so that its CRC-32 is `target`: the bytes a forger (or
 * a fault no CRC-32 can see) puts at a position, passing every per-fragment check. CRC-32 is
 * linear, so 4 chosen bytes reach any value: the indices the register must take through them
 * are found backwards from the target, then the bytes that give them forwards.
 */
export function withCrc32(body: Buffer, target: number): Buffer {
  if (body.length < 4) throw new Error('a body of at least 4 bytes is needed to force its CRC-32');
  const forged = Buffer.from(body);
  const prefix = forged.subarray(0, forged.length - 4);
  let register = (crc32(prefix) ^ 0xffffffff) >>> 0;
  let wanted = (target ^ 0xffffffff) >>> 0;
  const indices: number[] = [];
  for (let step = 0; step < 4; step++) {
    const index = BY_TOP_BYTE.get(wanted >>> 24) as number;
    indices.unshift(index);
    wanted = ((wanted ^ TABLE[index]) << 8) >>> 0;
  }
  for (let step = 0; step < 4; step++) {
    const byte = (register ^ indices[step]) & 0xff;
    forged[forged.length - 4 + step] = byte;
    register = ((register >>> 8) ^ TABLE[(register ^ byte) & 0xff]) >>> 0;
  }
  if (crc32(forged) !== target) throw new Error('CRC-32 forgery failed');
  return forged;
}

/**
 * A copy of `fragment` with other bytes of the same length under the very same headers (its
 * CRC-32 included): each of its bytes flipped, then its last 4 set to keep the CRC-32.
 */
export function forgedCopy(fragment: TestFragment): TestFragment {
  const changed = Buffer.from(fragment.body.map((byte) => byte ^ 0xff));
  return { ...fragment, body: withCrc32(changed, crc32(fragment.body)) };
}
