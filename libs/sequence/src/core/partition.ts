import { crc32 } from './checksum';

/** Most partitions a channel may have. */
export const MAX_PARTITIONS = 256;

/**
 * The partition of `key` (a sequence id) in a channel split into `count`: CRC-32 of its UTF-8
 * bytes, modulo `count`. Stable across processes, versions and transports, so that every producer
 * sends a sequence's fragments to the same partition.
 */
export function partitionIndex(key: string, count: number): number {
  if (!Number.isSafeInteger(count) || count < 1 || count > MAX_PARTITIONS) {
    throw new RangeError(partitionsProblem(count));
  }
  return crc32(Buffer.from(key, 'utf8')) % count;
}

/** Why `count` is not a usable partition count, or undefined when it is. */
export function partitionsProblem(count: unknown): string | undefined {
  const usable =
    typeof count === 'number' &&
    Number.isSafeInteger(count) &&
    count >= 1 &&
    count <= MAX_PARTITIONS;
  return usable
    ? undefined
    : `partitions must be an integer from 1 to ${MAX_PARTITIONS}, got ${String(count)}`;
}
