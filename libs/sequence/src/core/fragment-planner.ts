/**
 * Splitting a payload into fragment bodies. Three inputs, three planners:
 * - a payload of known length: {@link planFragments} computes the cuts up front, so the size
 *   header can travel on every fragment;
 * - a byte stream of unknown length: {@link chunkBytes} re-chunks it lazily;
 * - a stream of records: {@link packRecords} keeps each record whole when it can.
 *
 * The stream planners share one rule: every payload, even an empty one, is a sequence of at least
 * one fragment, so a consumer always receives a last fragment carrying the checksum and size.
 *
 * Bodies the stream planners yield may be views of the source's chunks rather than copies. Node
 * streams never reuse a chunk's memory once they have handed it out; a custom source must not
 * either.
 */

/** One fragment of a payload whose length is known before sending. */
export interface PlannedFragment {
  /** 1-based, as `x-sequence-position`. */
  readonly position: number;
  readonly offset: number;
  readonly length: number;
}

/**
 * Number of fragments {@link planFragments} cuts `totalBytes` into. An empty payload counts as one
 * fragment: a sequence of zero fragments could never complete.
 */
export function fragmentCount(totalBytes: number, fragmentBytes: number): number {
  assertTotalBytes(totalBytes);
  assertFragmentBytes(fragmentBytes);
  return Math.max(1, Math.ceil(totalBytes / fragmentBytes));
}

/**
 * Cuts a payload of known length into fragments of `fragmentBytes` (the last may be shorter).
 * Returns offsets, not bodies, so a caller holding a Buffer can `subarray` without copying.
 *
 * @example planFragments(10, 4) // offsets 0, 4, 8 with lengths 4, 4, 2
 */
export function planFragments(totalBytes: number, fragmentBytes: number): PlannedFragment[] {
  const count = fragmentCount(totalBytes, fragmentBytes);
  return Array.from({ length: count }, (_, index) => {
    const offset = index * fragmentBytes;
    return { position: index + 1, offset, length: Math.min(fragmentBytes, totalBytes - offset) };
  });
}

/**
 * Re-chunks a byte stream of unknown length into bodies of exactly `fragmentBytes` (the last may
 * be shorter). The source is pulled only when a fragment needs more bytes, so a Node Readable keeps
 * its back-pressure: at most one fragment plus one source chunk is held at a time.
 * An empty source yields one empty body.
 */
export async function* chunkBytes(
  source: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
  fragmentBytes: number,
): AsyncGenerator<Buffer> {
  assertFragmentBytes(fragmentBytes);
  const pending = new PendingFragment();
  let yieldedAny = false;
  for await (const chunk of source) {
    let rest = asBuffer(chunk);
    while (rest.length > 0) {
      // A chunk that already holds a whole fragment goes out as a view: no copy.
      if (pending.bytes === 0 && rest.length >= fragmentBytes) {
        yield rest.subarray(0, fragmentBytes);
        yieldedAny = true;
        rest = rest.subarray(fragmentBytes);
        continue;
      }
      const taken = Math.min(fragmentBytes - pending.bytes, rest.length);
      pending.add(rest.subarray(0, taken));
      rest = rest.subarray(taken);
      if (pending.bytes === fragmentBytes) {
        yield pending.take();
        yieldedAny = true;
      }
    }
  }
  if (pending.bytes > 0 || !yieldedAny) yield pending.take();
}

/**
 * Packs records into fragments without cutting a record across two fragments, so a consumer that
 * takes fragments one by one (a stream-mode handler, or a human reading a dead-lettered one) sees
 * whole records; `ReassembledPayload.stream()` chunks need not follow fragments. A record
 * larger than `fragmentBytes` cannot be kept whole: it starts on a fresh fragment, is cut at
 * `fragmentBytes`, and its tail is shared with the records that follow. No records yields one
 * empty body.
 */
export async function* packRecords(
  records: AsyncIterable<Uint8Array> | Iterable<Uint8Array>,
  fragmentBytes: number,
): AsyncGenerator<Buffer> {
  assertFragmentBytes(fragmentBytes);
  const pending = new PendingFragment();
  let yieldedAny = false;
  for await (const item of records) {
    let record = asBuffer(item);
    if (pending.bytes > 0 && pending.bytes + record.length > fragmentBytes) {
      yield pending.take();
      yieldedAny = true;
    }
    while (record.length > fragmentBytes) {
      yield record.subarray(0, fragmentBytes);
      yieldedAny = true;
      record = record.subarray(fragmentBytes);
    }
    pending.add(record);
    // Sending a full fragment at once rather than on the next record keeps memory to one fragment.
    if (pending.bytes === fragmentBytes) {
      yield pending.take();
      yieldedAny = true;
    }
  }
  if (pending.bytes > 0 || !yieldedAny) yield pending.take();
}

/**
 * Pairs each item with whether it is the last, looking one item ahead. The splitter needs this
 * because the last fragment of a stream carries headers (size, SHA-256) the others do not, and a
 * stream only tells it has ended after the fact. Ending the loop early closes the source.
 */
export async function* withLast<T>(
  source: AsyncIterable<T> | Iterable<T>,
): AsyncGenerator<{ value: T; last: boolean }> {
  // Boxed so that an `undefined` item is told apart from "nothing seen yet".
  let previous: { value: T } | undefined;
  for await (const value of source) {
    if (previous !== undefined) yield { value: previous.value, last: false };
    previous = { value };
  }
  if (previous !== undefined) yield { value: previous.value, last: true };
}

/** The pieces of one fragment being filled; concatenated only when it is taken. */
class PendingFragment {
  private pieces: Buffer[] = [];
  bytes = 0;

  add(piece: Buffer): void {
    if (piece.length === 0) return;
    this.pieces.push(piece);
    this.bytes += piece.length;
  }

  take(): Buffer {
    const body = this.pieces.length === 1 ? this.pieces[0] : Buffer.concat(this.pieces, this.bytes);
    this.pieces = [];
    this.bytes = 0;
    return body;
  }
}

function asBuffer(chunk: Uint8Array): Buffer {
  if (Buffer.isBuffer(chunk)) return chunk;
  // `ArrayBuffer.isView` rather than `instanceof`: typed arrays from another realm (vm, jest) fail
  // `instanceof`. A string means the stream had an encoding set, which would corrupt binary data.
  if (!ArrayBuffer.isView(chunk)) {
    throw new TypeError(
      `expected byte chunks (Buffer or Uint8Array), got ${typeof chunk}; ` +
        'do not set an encoding on the source stream',
    );
  }
  return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
}

function assertTotalBytes(totalBytes: number): void {
  if (!Number.isSafeInteger(totalBytes) || totalBytes < 0) {
    throw new RangeError(`totalBytes must be a non-negative integer, got ${totalBytes}`);
  }
}

function assertFragmentBytes(fragmentBytes: number): void {
  if (!Number.isSafeInteger(fragmentBytes) || fragmentBytes < 1) {
    throw new RangeError(`fragmentBytes must be an integer >= 1, got ${fragmentBytes}`);
  }
}
