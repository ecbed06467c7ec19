import type { HeaderValue } from '../../../core/headers';
import {
  heldEntryBytes,
  type HandOffItem,
  type ResequencedEntry,
} from '../../../ports/resequencer-store.port';

/*
 * How entries and hand-off items are stored (the TypeScript side of lua/_resequencer.lua).
 *
 * An entry is JSON {n: bytes, s: seq, h: headers, b: body in base64}: JSON keeps each header's
 * type (string, number, boolean), base64 keeps the body byte-exact through Lua and the RESP2
 * string replies ioredis decodes as UTF-8. `n`, first, is what the entry counts for against the
 * byte bounds (heldEntryBytes): the only part the Lua scripts read; otherwise they move the entry
 * whole, with a one-character kind tag and the item's numbers in front (see _resequencer.lua).
 *
 * A store that encrypts writes {n, s, x: the sealed entry in base64} instead (headers and body
 * sealed together: adapters/stores/sealed-entry.ts); `n` still counts the plaintext.
 */

/**
 * How a store that encrypts keeps entries: `seal` for the way in; `open` for the way out, which
 * answers the entry, or why it is `undecryptable` (dead-lettered, never delivered): it did not
 * decrypt, or it was stored in plaintext (`sealed` undefined), which this store does not trust.
 */
export interface EntrySealing {
  seal(entry: ResequencedEntry): Buffer;
  open(
    seq: number,
    sealed: Buffer | undefined,
  ): ResequencedEntry | { readonly undecryptable: string };
}

/** A stored entry or item is not what this codec writes: corrupt, or of another version. */
export class CorruptRecord extends Error {
  constructor(detail: string, text: string) {
    super(`${detail} in ${JSON.stringify(text.length > 80 ? `${text.slice(0, 80)}…` : text)}`);
    this.name = 'CorruptRecord';
  }
}

/**
 * The entry as the scripts store it. Throws a `TypeError` for a body that is not a Buffer and a
 * `RangeError` for a header value that could not come back with its type (a non-finite number
 * would turn into `null`).
 */
export function encodeEntry(entry: ResequencedEntry, sealing?: EntrySealing): string {
  if (!Buffer.isBuffer(entry.body)) {
    throw new TypeError(`the body of sequence ${entry.seq} must be a Buffer`);
  }
  for (const [name, value] of Object.entries(entry.headers)) {
    if (!isHeaderValue(value)) {
      throw new RangeError(
        `header ${JSON.stringify(name)} of sequence ${entry.seq} must be a string, a finite ` +
          `number or a boolean, got ${String(value)}`,
      );
    }
  }
  const n = heldEntryBytes(entry);
  if (sealing)
    return JSON.stringify({ n, s: entry.seq, x: sealing.seal(entry).toString('base64') });
  return JSON.stringify({ n, s: entry.seq, h: entry.headers, b: entry.body.toString('base64') });
}

const BASE64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

/**
 * Reads what {@link encodeEntry} wrote; throws {@link CorruptRecord} for anything else. With
 * `sealing`, a sealed entry is opened, and one that does not open is reported, not thrown.
 */
export function decodeEntry(
  text: string,
  sealing?: EntrySealing,
): ResequencedEntry | { readonly seq: number; readonly undecryptable: string } {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new CorruptRecord('an entry that is not JSON', text);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw new CorruptRecord('an entry that is not an object', text);
  }
  const { s: seq, h: headers, b: body, x: sealed } = parsed as Record<string, unknown>;
  if (typeof seq !== 'number' || !Number.isSafeInteger(seq) || seq < 0) {
    throw new CorruptRecord('an entry without a valid sequence', text);
  }
  if (sealed !== undefined || sealing) {
    if (sealed !== undefined && (typeof sealed !== 'string' || !BASE64.test(sealed))) {
      throw new CorruptRecord('a sealed entry that is not base64', text);
    }
    if (!sealing) throw new CorruptRecord('a sealed entry, and no encryption keys', text);
    const opened = sealing.open(
      seq,
      sealed === undefined ? undefined : Buffer.from(sealed, 'base64'),
    );
    return 'undecryptable' in opened ? { seq, undecryptable: opened.undecryptable } : opened;
  }
  if (
    typeof headers !== 'object' ||
    headers === null ||
    Array.isArray(headers) ||
    !Object.values(headers).every(isHeaderValue)
  ) {
    throw new CorruptRecord('an entry with invalid headers', text);
  }
  if (typeof body !== 'string' || !BASE64.test(body)) {
    throw new CorruptRecord('an entry without a base64 body', text);
  }
  return {
    seq,
    body: Buffer.from(body, 'base64'),
    headers: headers as Record<string, HeaderValue>,
  };
}

const DEAD_LETTER = /^(\d+):/;
const GAP_ALERT = /^(\d+):(\d+):(-?\d+)$/;
const GAP_SKIPPED = /^(\d+):(\d+)$/;

/** Reads a hand-off item the scripts wrote; throws {@link CorruptRecord} for anything else. */
export function decodeItem(text: string, sealing?: EntrySealing): HandOffItem {
  const fields = text.slice(1);
  switch (text[0]) {
    case 'e': {
      const entry = decodeEntry(fields, sealing);
      return 'undecryptable' in entry
        ? { kind: 'undecryptable', seq: entry.seq, detail: entry.undecryptable }
        : { kind: 'event', entry };
    }
    case 'd': {
      const match = DEAD_LETTER.exec(fields);
      if (!match) break;
      const entry = decodeEntry(fields.slice(match[0].length), sealing);
      return 'undecryptable' in entry
        ? { kind: 'undecryptable', seq: entry.seq, detail: entry.undecryptable }
        : { kind: 'dead-letter', entry, expected: Number(match[1]) };
    }
    case 'a': {
      const match = GAP_ALERT.exec(fields);
      if (!match) break;
      const [, expected, buffered, gapSince] = match.map(Number);
      return { kind: 'gap-alert', expected, buffered, gapSince };
    }
    case 's': {
      const match = GAP_SKIPPED.exec(fields);
      if (!match) break;
      return { kind: 'gap-skipped', from: Number(match[1]), to: Number(match[2]) };
    }
  }
  throw new CorruptRecord('a hand-off item of unknown layout', text);
}

function isHeaderValue(value: unknown): value is HeaderValue {
  return (
    typeof value === 'string' ||
    typeof value === 'boolean' ||
    (typeof value === 'number' && Number.isFinite(value))
  );
}
