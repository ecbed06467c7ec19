/**
 * A synthetic imaging study: a stream of DICOM-like records, each an 8-byte header (tag, length)
 * followed by "pixel data". Generated lazily so the sender never holds the whole study.
 *
 *   record = tag (uint32 BE) | length (uint32 BE) | value (length bytes)
 */
export const RECORD_HEADER_BYTES = 8;
export const PIXEL_DATA_TAG = 0x7fe00010;

export interface StudyRecord {
  readonly tag: number;
  readonly value: Buffer;
}

/**
 * Yields encoded records summing to exactly `totalBytes` (0, or at least one record header: 8),
 * deterministic for a given seed.
 */
export function* syntheticStudy(
  totalBytes: number,
  recordBytes = 512 * 1024,
  seed = 1,
): Generator<Buffer> {
  if (totalBytes > 0 && totalBytes < RECORD_HEADER_BYTES) {
    throw new RangeError(
      `a study has 0 or at least ${RECORD_HEADER_BYTES} bytes, not ${totalBytes}`,
    );
  }
  let state = seed >>> 0 || 1;
  let remaining = totalBytes;
  while (remaining > 0) {
    let take = Math.min(recordBytes, remaining);
    // A rest too small for a record header goes into this record instead.
    if (remaining - take < RECORD_HEADER_BYTES) take = remaining;
    const valueBytes = take - RECORD_HEADER_BYTES;
    const record = Buffer.allocUnsafe(RECORD_HEADER_BYTES + valueBytes);
    record.writeUInt32BE(PIXEL_DATA_TAG, 0);
    record.writeUInt32BE(valueBytes, 4);
    for (let i = RECORD_HEADER_BYTES; i < record.length; i++) {
      state ^= state << 13; // xorshift32: cheap, repeatable "pixels"
      state ^= state >>> 17;
      state ^= state << 5;
      record[i] = state & 0xff;
    }
    remaining -= record.length;
    yield record;
  }
}

/** Splits a byte stream back into records, whatever the chunk boundaries. */
export async function* readRecords(chunks: AsyncIterable<Buffer>): AsyncGenerator<StudyRecord> {
  let pending: Buffer = Buffer.alloc(0);
  for await (const chunk of chunks) {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
    let offset = 0;
    while (pending.length - offset >= RECORD_HEADER_BYTES) {
      const length = pending.readUInt32BE(offset + 4);
      const end = offset + RECORD_HEADER_BYTES + length;
      if (end > pending.length) break;
      yield {
        tag: pending.readUInt32BE(offset),
        value: pending.subarray(offset + RECORD_HEADER_BYTES, end),
      };
      offset = end;
    }
    pending = pending.subarray(offset);
  }
  if (pending.length > 0)
    throw new Error(`study ends inside a record (${pending.length} bytes left over)`);
}
