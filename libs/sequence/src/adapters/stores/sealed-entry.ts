import type { BodyCipher } from '../../core/body-cipher';
import type { HeaderValue } from '../../core/headers';
import { SealedBufferFailure } from '../../core/sealed-buffer';
import type {
  HandOffItem,
  ResequencedEntry,
  ResequencerKey,
} from '../../ports/resequencer-store.port';

/*
 * A resequencer entry kept encrypted (the resequencer stores' `encryption` option): its headers
 * and body sealed together, bound to the scope, key and sequence they were accepted under.
 * Sealed: a 4-byte length of the headers' JSON, that JSON, the body.
 */

function identity(key: ResequencerKey, seq: number): readonly (string | number)[] {
  return ['resequencer-entry', key.scope, key.key, seq];
}

export function sealEntry(
  cipher: BodyCipher,
  key: ResequencerKey,
  entry: ResequencedEntry,
): Buffer {
  const headers = Buffer.from(JSON.stringify(entry.headers));
  const length = Buffer.alloc(4);
  length.writeUInt32BE(headers.length);
  return cipher.seal(Buffer.concat([length, headers, entry.body]), identity(key, entry.seq));
}

/**
 * The entry sealed as `seq` of `key`; a {@link SealedBufferFailure} (`reason`, a clear message)
 * when it does not open: altered, moved from another key or sequence, or its key not listed.
 */
export function openEntry(
  cipher: BodyCipher,
  key: ResequencerKey,
  seq: number,
  sealed: Uint8Array,
): ResequencedEntry | SealedBufferFailure {
  try {
    const packed = cipher.open(sealed, identity(key, seq));
    const length = packed.readUInt32BE(0);
    const headers = JSON.parse(packed.toString('utf8', 4, 4 + length)) as Record<
      string,
      HeaderValue
    >;
    return { seq, headers, body: packed.subarray(4 + length) };
  } catch (error) {
    if (error instanceof SealedBufferFailure) return error;
    // Authentic yet not of this layout: only a writer holding the key could have made it.
    return new SealedBufferFailure('malformed-header');
  }
}

/** What is said of an entry that did not decrypt, in its dead-letter reason. */
export function undecryptableDetail(
  key: ResequencerKey,
  seq: number,
  failure: SealedBufferFailure | 'not-sealed',
): string {
  const why =
    failure === 'not-sealed'
      ? 'it was stored without encryption, and this store encrypts'
      : `${failure.reason}${failure.keyId === undefined ? '' : `, key id ${JSON.stringify(failure.keyId)}`}`;
  const advice =
    failure !== 'not-sealed' && failure.reason === 'unknown-key'
      ? 'add that key to the store encryption keys'
      : 'it was altered in the store, or written under other key material';
  return (
    `key ${key.key}, event ${seq}: the stored event did not decrypt (${why}); ${advice}; ` +
    'the key moved on'
  );
}

/** The hand-off item for an entry that did not decrypt: dead-lettered, never delivered. */
export function undecryptableItem(
  key: ResequencerKey,
  seq: number,
  failure: SealedBufferFailure | 'not-sealed',
): HandOffItem {
  return { kind: 'undecryptable', seq, detail: undecryptableDetail(key, seq, failure) };
}
