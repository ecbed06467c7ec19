import type {
  ClaimOptions,
  NewBoxRecord,
  PurgeOptions,
  RecordOutcome,
  StoredRecord,
} from '../../../ports/outbox-store.port';

/**
 * Checks of what callers hand to an outbox store, before anything touches the database. They
 * throw RangeError, as the other stores do for arguments out of their contract. Nothing here is
 * SQLite's: the PostgreSQL store can share it.
 */

const MAX_ID_LENGTH = 200;

/** A whole number of milliseconds (a time) or a count at least `min`. */
function assertInteger(what: string, value: unknown, min: number): asserts value is number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min) {
    throw new RangeError(`${what} must be an integer of at least ${min}, got ${String(value)}`);
  }
}

export function assertTime(what: string, value: unknown): asserts value is number {
  assertInteger(what, value, 0);
}

export function assertLimit(what: string, value: unknown): asserts value is number {
  assertInteger(what, value, 1);
}

/**
 * Throws unless `value` is an array. (Not `Array.isArray` inline: on a readonly array type it
 * narrows to `any[]`.)
 */
export function assertArray(what: string, value: unknown): void {
  if (!Array.isArray(value)) throw new RangeError(`${what} must be an array`);
}

export function assertRecordId(value: unknown, what = 'record id'): asserts value is string {
  // Characters as the databases count them (code points), not UTF-16 units.
  const length = typeof value === 'string' ? [...value].length : 0;
  if (length < 1 || length > MAX_ID_LENGTH) {
    throw new RangeError(
      `${what} must be a string of 1 to ${MAX_ID_LENGTH} characters, got ${JSON.stringify(value)}`,
    );
  }
}

export function assertNewRecord(record: NewBoxRecord): void {
  assertRecordId(record?.id);
  const about = `record ${record.id}`;
  if (record.kind !== 'event' && record.kind !== 'command') {
    throw new RangeError(
      `${about}: kind must be 'event' or 'command', got ${JSON.stringify(record.kind)}`,
    );
  }
  if (typeof record.type !== 'string' || record.type.length === 0) {
    throw new RangeError(`${about}: type must be a non-empty string`);
  }
  if (record.partitionKey != null && typeof record.partitionKey !== 'string') {
    throw new RangeError(`${about}: partitionKey must be a string or null`);
  }
  if (typeof record.body !== 'string') {
    throw new RangeError(`${about}: body must be a string (the message as JSON text)`);
  }
  const headers: unknown = record.headers;
  if (typeof headers !== 'object' || headers === null || Array.isArray(headers)) {
    throw new RangeError(`${about}: headers must be an object of strings`);
  }
  for (const [name, value] of Object.entries(headers)) {
    if (typeof value !== 'string') {
      throw new RangeError(`${about}: header ${name} must be a string, got ${typeof value}`);
    }
  }
}

export function assertClaimOptions(options: ClaimOptions): void {
  assertLimit('claim limit', options?.limit);
  assertTime('claim now', options.now);
}

export function assertPurgeOptions(options: PurgeOptions): void {
  assertTime('purge completedBefore', options?.completedBefore);
  assertLimit('purge batchSize', options.batchSize);
  if (options.maxBatches !== undefined) assertLimit('purge maxBatches', options.maxBatches);
}

export function assertIds(ids: readonly string[]): void {
  assertArray('ids', ids);
  for (const id of ids) assertRecordId(id);
}

/**
 * The outcomes a claim's handler returned, checked against the records it was handed: each
 * names one of them, at most once (an outcome for a record of another claim would change a
 * record that this claim does not hold).
 */
export function assertOutcomes(
  claimed: readonly StoredRecord[],
  outcomes: readonly RecordOutcome[],
): void {
  assertArray('what a claim handler resolves with (its outcomes)', outcomes);
  const handedOut = new Set(claimed.map((record) => record.id));
  const seen = new Set<string>();
  for (const outcome of outcomes) {
    const id = outcome?.id;
    if (!handedOut.has(id)) {
      throw new RangeError(
        `claim outcome for ${JSON.stringify(id)}, a record this claim did not hand out`,
      );
    }
    if (seen.has(id)) throw new RangeError(`two claim outcomes for record ${id}`);
    seen.add(id);
    switch (outcome.status) {
      case 'completed':
      case 'released':
        break;
      case 'retry':
        assertTime(`retry nextAttemptAt of record ${id}`, outcome.nextAttemptAt);
        assertError(id, outcome.error);
        break;
      case 'failed':
        assertError(id, outcome.error);
        break;
      default:
        throw new RangeError(
          `claim outcome for record ${id} has status ${JSON.stringify((outcome as { status: unknown }).status)}; expected completed, retry, failed or released`,
        );
    }
  }
}

function assertError(id: string, error: unknown): void {
  if (typeof error !== 'string') {
    throw new RangeError(`claim outcome for record ${id} must give its error as a string`);
  }
}
