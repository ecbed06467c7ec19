import {
  heldEntryBytes,
  type GapPolicy,
  type HandOffItem,
  type ResequencedEntry,
} from '../../../ports/resequencer-store.port';

/**
 * An entry as the memory store holds it. When the store encrypts, `body` is the sealed entry
 * (adapters/stores/sealed-entry.ts), `headers` are empty and `heldBytes` is what the plaintext
 * counts for against the byte bounds, so that bounds mean the same with encryption on.
 */
export interface HeldEntry extends ResequencedEntry {
  readonly heldBytes?: number;
}

/** The bytes an entry counts for ({@link heldEntryBytes} of its plaintext). */
function entryBytes(entry: HeldEntry): number {
  return entry.heldBytes ?? heldEntryBytes(entry);
}

/** The memory store's state of one resequencer key (see the port for what each part means). */
export interface ResequencerKeyRecord {
  /** The next sequence to release. */
  next: number;
  /** Early events by sequence (not kept sorted: bounded by `maxBufferedPerKey`). */
  readonly buffer: Map<number, HeldEntry>;
  /** What is ready to deliver, in delivery order. */
  readonly handOff: HandOffItem[];
  /** Bytes of the buffer's events (counted by `heldEntryBytes`). */
  bufferBytes: number;
  /** Bytes of the hand-off list's events. */
  handOffBytes: number;
  lease?: { readonly holder: string; until: number };
  /** When the current gap opened; set while the buffer is not empty. */
  gapSince?: number;
  /** Whether the `'alert'` policy reported the current gap. */
  alerted: boolean;
  /** When the hand-off list last became non-empty or was last settled; set while it is not empty. */
  handOffAt?: number;
  /** Set while the hand-off list holds items a gap resolution appended (listed when stalled). */
  tracked?: boolean;
  /** The last write: the record expires `retentionMs` after it. */
  lastWriteAt: number;
  /** Set while the key is retired (`ResequencerStore.retire`): it expires then, if not before. */
  retiredUntil?: number;
  /** Set once the key was closed (`next` is then CLOSED_KEY_NEXT): the sequence that went missing. */
  closedFrom?: number;
}

export function newKeyRecord(start: number, now: number): ResequencerKeyRecord {
  return {
    next: start,
    buffer: new Map(),
    handOff: [],
    bufferBytes: 0,
    handOffBytes: 0,
    alerted: false,
    lastWriteAt: now,
  };
}

/** Buffers an event (copied), counting its bytes. */
export function bufferEntry(record: ResequencerKeyRecord, entry: HeldEntry): void {
  record.buffer.set(entry.seq, copyEntry(entry));
  record.bufferBytes += entryBytes(entry);
}

/** The bytes an item holds: its event's, none for a gap record. */
export function itemBytes(item: HandOffItem): number {
  return item.kind === 'event' || item.kind === 'dead-letter' ? entryBytes(item.entry) : 0;
}

/** Removes the first `count` items of the hand-off list (they were delivered). */
export function settleHandOff(record: ResequencerKeyRecord, count: number): void {
  for (const item of record.handOff.splice(0, count)) record.handOffBytes -= itemBytes(item);
  if (record.handOff.length === 0) record.handOffBytes = 0;
}

/**
 * A copy of an entry: the store must not share a Buffer with its caller, which may reuse it
 * (on the way in) or change what it was handed (on the way out, then handed out again).
 */
export function copyEntry(entry: HeldEntry): HeldEntry {
  const copy = { seq: entry.seq, body: Buffer.from(entry.body), headers: { ...entry.headers } };
  return entry.heldBytes === undefined ? copy : { ...copy, heldBytes: entry.heldBytes };
}

export function copyItem(item: HandOffItem): HandOffItem {
  return item.kind === 'event' || item.kind === 'dead-letter'
    ? { ...item, entry: copyEntry(item.entry) }
    : { ...item };
}

/** Appends to the hand-off list; the wait for a drain starts when the list stops being empty. */
export function appendHandOff(
  record: ResequencerKeyRecord,
  items: readonly HandOffItem[],
  now: number,
): void {
  if (items.length === 0) return;
  if (record.handOff.length === 0) record.handOffAt = now;
  record.handOff.push(...items);
  for (const item of items) record.handOffBytes += itemBytes(item);
}

/** Takes an event out of the buffer (to the hand-off list), its bytes with it. */
function unbuffer(record: ResequencerKeyRecord, entry: HeldEntry): void {
  record.buffer.delete(entry.seq);
  record.bufferBytes = record.buffer.size === 0 ? 0 : record.bufferBytes - entryBytes(entry);
}

/**
 * Moves `next` and the contiguous run after it from the buffer to the hand-off list and
 * advances `next` past them; a buffer left non-empty is a new gap, opened now. Returns how
 * many events it released.
 */
export function releaseRun(record: ResequencerKeyRecord, now: number): number {
  const released: HandOffItem[] = [];
  for (let entry = record.buffer.get(record.next); entry; entry = record.buffer.get(record.next)) {
    unbuffer(record, entry);
    released.push({ kind: 'event', entry });
    record.next = entry.seq + 1;
  }
  appendHandOff(record, released, now);
  reopenGap(record, now);
  return released.length;
}

/** After the buffer changed by a release: what is still buffered waits behind a new gap. */
export function reopenGap(record: ResequencerKeyRecord, now: number): void {
  record.gapSince = record.buffer.size > 0 ? now : undefined;
  record.alerted = false;
}

/** Buffered sequences, ascending. */
export function bufferedSeqs(record: ResequencerKeyRecord): number[] {
  return [...record.buffer.keys()].sort((a, b) => a - b);
}

/** The lowest buffered sequence (a loop: the buffer may be too large to spread). */
export function lowestBuffered(record: ResequencerKeyRecord): number {
  let lowest = Number.POSITIVE_INFINITY;
  for (const seq of record.buffer.keys()) if (seq < lowest) lowest = seq;
  return lowest;
}

/**
 * Applies a gap policy to a key whose buffer is not empty; returns how many items it appended
 * (0: nothing to do, the gap was alerted already).
 */
export function applyPolicy(record: ResequencerKeyRecord, policy: GapPolicy, now: number): number {
  const expected = record.next;
  switch (policy) {
    case 'alert': {
      if (record.alerted) return 0;
      const { size: buffered } = record.buffer;
      appendHandOff(
        record,
        [{ kind: 'gap-alert', expected, buffered, gapSince: record.gapSince! }],
        now,
      );
      record.alerted = true;
      return 1;
    }
    case 'skip': {
      const lowest = lowestBuffered(record);
      appendHandOff(record, [{ kind: 'gap-skipped', from: expected, to: lowest - 1 }], now);
      record.next = lowest;
      return 1 + releaseRun(record, now);
    }
    case 'dead-letter': {
      const seqs = bufferedSeqs(record);
      const items = seqs.map((seq): HandOffItem => ({
        kind: 'dead-letter',
        entry: record.buffer.get(seq)!,
        expected,
      }));
      appendHandOff(record, items, now);
      record.buffer.clear();
      record.bufferBytes = 0;
      record.next = seqs[seqs.length - 1] + 1;
      reopenGap(record, now);
      return items.length;
    }
  }
}

/** The first `limit` items of the hand-off list, copied. */
export function head(record: ResequencerKeyRecord, limit: number): HandOffItem[] {
  return record.handOff.slice(0, limit).map(copyItem);
}
