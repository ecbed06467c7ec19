/**
 * Argument checks every OutboxStore adapter applies the same way, before it touches its database:
 * a `RangeError` naming the method and the argument (as the other ports' stores do), so that a
 * call out of the contract fails alike on every store and does nothing.
 */
import { replaceLoneSurrogates, unstorableText } from '../core/unicode';
import {
  BOX_NAMES,
  type BoxName,
  type ClaimOptions,
  type NewBoxRecord,
  type PurgeOptions,
  type RecordOutcome,
  type StoredRecord,
} from './outbox-store.port';

/** The longest record id, in characters (code points, as the databases count them). */
export const MAX_RECORD_ID_LENGTH = 200;

/** The latest time a store takes (ms since the epoch): the latest a `Date` can hold. */
export const LATEST_TIME_MS = 8_640_000_000_000_000;

/**
 * An outcome's error as every store keeps it: NUL and lone surrogates replaced by U+FFFD. An
 * error's text comes from anywhere (a broker's reply, a handler's exception quoting its input),
 * so it is kept rather than refused: refusing it would roll the claim back and publish the
 * record again.
 */
export function storableError(error: string): string {
  return unstorableText(error) === undefined
    ? error
    : replaceLoneSurrogates(error.replaceAll('\u0000', '\uFFFD'));
}

function refusal(operation: string, detail: string): RangeError {
  return new RangeError(`outbox store ${operation}: ${detail}`);
}

/** A value as a message shows it: strings quoted (a long one cut), anything else by its kind. */
function shown(value: unknown): string {
  if (typeof value === 'string') {
    const characters = [...value];
    if (characters.length <= 40) return JSON.stringify(value);
    return `${JSON.stringify(characters.slice(0, 40).join(''))}... (${characters.length} characters)`;
  }
  if (typeof value === 'function') return 'a function';
  if (Array.isArray(value)) return 'an array';
  if (value !== null && typeof value === 'object') return 'an object';
  return String(value);
}

export function assertBox(operation: string, box: unknown): asserts box is BoxName {
  if (!(BOX_NAMES as readonly unknown[]).includes(box)) {
    throw refusal(operation, `unknown box ${shown(box)}; use one of ${BOX_NAMES.join(', ')}`);
  }
}

/** A time: a whole number of milliseconds since the epoch, from 0 to `LATEST_TIME_MS`. */
export function assertTime(
  operation: string,
  name: string,
  value: unknown,
): asserts value is number {
  if (!Number.isSafeInteger(value) || (value as number) < 0 || (value as number) > LATEST_TIME_MS) {
    throw refusal(
      operation,
      `${name} must be a whole number of ms from 0 to ${LATEST_TIME_MS}, got ${shown(value)}`,
    );
  }
}

/** A count (a limit, a batch size): a whole number of at least 1. */
export function assertLimit(
  operation: string,
  name: string,
  value: unknown,
): asserts value is number {
  if (!Number.isSafeInteger(value) || (value as number) < 1) {
    throw refusal(operation, `${name} must be a whole number of at least 1, got ${shown(value)}`);
  }
}

/** Throws unless `value` is an array (not `Array.isArray` inline: on a readonly array type it narrows to `any[]`). */
function assertArray(operation: string, name: string, value: unknown): void {
  if (!Array.isArray(value))
    throw refusal(operation, `${name} must be an array, got ${shown(value)}`);
}

export function assertRecordId(
  operation: string,
  value: unknown,
  name = 'id',
): asserts value is string {
  // UTF-16 units bound the code points from above: only a long id needs them counted (appends
  // check every id, so the common one is not spread into an array).
  const length =
    typeof value !== 'string'
      ? 0
      : value.length <= MAX_RECORD_ID_LENGTH
        ? value.length
        : [...value].length;
  if (length < 1 || length > MAX_RECORD_ID_LENGTH) {
    throw refusal(
      operation,
      `${name} must be a string of 1 to ${MAX_RECORD_ID_LENGTH} characters, got ${shown(value)}`,
    );
  }
  assertStorable(operation, name, value as string);
}

/** Throws unless every store keeps `text` as given (see `unstorableText`). */
function assertStorable(operation: string, name: string, text: string): void {
  const problem = unstorableText(text);
  if (problem !== undefined) {
    throw refusal(operation, `${name} must not hold ${problem}, got ${shown(text)}`);
  }
}

/** Record ids to act on (`retry`, `discard`): an array of ids, possibly empty. */
export function assertIds(operation: string, ids: unknown): void {
  assertArray(operation, 'ids', ids);
  for (const id of ids as readonly unknown[]) assertRecordId(operation, id, 'every one of ids');
}

/** Partition keys to lock: an array of strings, possibly empty. */
export function assertPartitionKeys(operation: string, keys: unknown): void {
  assertArray(operation, 'keys', keys);
  for (const key of keys as readonly unknown[]) {
    if (typeof key !== 'string') {
      throw refusal(operation, `every one of keys must be a string, got ${shown(key)}`);
    }
  }
}

export function assertNewRecords(operation: string, records: unknown): void {
  assertArray(operation, 'records', records);
  for (const record of records as readonly NewBoxRecord[]) assertNewRecord(operation, record);
}

export function assertNewRecord(operation: string, record: NewBoxRecord): void {
  assertRecordId(operation, record?.id, 'a record id');
  const about = `record ${JSON.stringify(record.id)}`;
  if (record.kind !== 'event' && record.kind !== 'command') {
    throw refusal(
      operation,
      `${about}: kind must be 'event' or 'command', got ${shown(record.kind)}`,
    );
  }
  if (typeof record.type !== 'string' || record.type.length === 0) {
    throw refusal(
      operation,
      `${about}: type must be a non-empty string, got ${shown(record.type)}`,
    );
  }
  assertStorable(operation, `${about}: type`, record.type);
  if (record.partitionKey != null && typeof record.partitionKey !== 'string') {
    throw refusal(operation, `${about}: partitionKey must be a string or null`);
  }
  if (record.partitionKey != null) {
    assertStorable(operation, `${about}: partitionKey`, record.partitionKey);
  }
  if (typeof record.body !== 'string') {
    throw refusal(operation, `${about}: body must be a string (the message as JSON text)`);
  }
  assertStorable(operation, `${about}: body`, record.body);
  const headers: unknown = record.headers;
  if (typeof headers !== 'object' || headers === null || Array.isArray(headers)) {
    throw refusal(operation, `${about}: headers must be an object of strings`);
  }
  for (const [name, value] of Object.entries(headers)) {
    if (typeof value !== 'string') {
      throw refusal(operation, `${about}: header ${name} must be a string, got ${typeof value}`);
    }
    assertStorable(operation, `${about}: a header name`, name);
    assertStorable(operation, `${about}: header ${JSON.stringify(name)}`, value);
  }
}

export function assertClaimOptions(options: ClaimOptions): void {
  if (options === null || typeof options !== 'object') {
    throw refusal('claim', `options must be an object, got ${shown(options)}`);
  }
  assertLimit('claim', 'limit', options.limit);
  assertTime('claim', 'now', options.now);
  if (options.horizon !== undefined) assertTime('claim', 'horizon', options.horizon);
}

export function assertPurgeOptions(options: PurgeOptions): void {
  if (options === null || typeof options !== 'object') {
    throw refusal('purge', `options must be an object, got ${shown(options)}`);
  }
  assertTime('purge', 'completedBefore', options.completedBefore);
  assertLimit('purge', 'batchSize', options.batchSize);
  if (options.maxBatches !== undefined) assertLimit('purge', 'maxBatches', options.maxBatches);
}

export function assertListener(listener: unknown): void {
  if (typeof listener !== 'function') {
    throw refusal('watch', `listener must be a function, got ${shown(listener)}`);
  }
}

/**
 * The outcomes a claim's handler resolved with, checked against the records it was handed: each
 * names one of them, at most once (an outcome for a record of another claim would change a
 * record that this claim does not hold), with a known status, and an error (and a time) where
 * the status needs one.
 */
export function assertOutcomes(
  claimed: readonly StoredRecord[],
  outcomes: readonly RecordOutcome[],
): void {
  assertArray('claim', 'what the handler resolves with (its outcomes)', outcomes);
  const handedOut = new Set(claimed.map((record) => record.id));
  const seen = new Set<string>();
  for (const outcome of outcomes) {
    const id = (outcome as RecordOutcome | null | undefined)?.id;
    if (id === undefined || !handedOut.has(id)) {
      throw refusal(
        'claim',
        `the handler returned an outcome for ${shown(id)}, a record this claim did not hand ` +
          'out; return outcomes only for batch.records',
      );
    }
    if (seen.has(id)) {
      throw refusal('claim', `the handler returned two outcomes for record ${id}; return one`);
    }
    seen.add(id);
    switch (outcome.status) {
      case 'completed':
      case 'released':
        break;
      case 'retry':
        assertTime(
          'claim',
          `the retry outcome's nextAttemptAt of record ${id}`,
          outcome.nextAttemptAt,
        );
        assertError(id, outcome.error);
        break;
      case 'failed':
        assertError(id, outcome.error);
        break;
      default:
        throw refusal(
          'claim',
          `the outcome for record ${id} has status ` +
            `${shown((outcome as { status: unknown }).status)}; expected completed, retry, failed ` +
            'or released',
        );
    }
  }
}

function assertError(id: string, error: unknown): void {
  if (typeof error !== 'string') {
    throw refusal('claim', `the outcome for record ${id} must give its error as a string`);
  }
}
