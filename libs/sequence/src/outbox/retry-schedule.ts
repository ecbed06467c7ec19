import { textOf } from '../core/errors/caught';
import type { RecordOutcome, StoredRecord } from '../ports/outbox-store.port';
import type { ResolvedBoxOptions, ResolvedRetryPolicy } from '../options/resolved-options';

/**
 * The delay before attempt `attempt + 1`, after `attempt` failed ones: `baseDelayMs` doubled per
 * attempt up to `maxDelayMs`, of which a random half ("equal jitter"), so that records that failed
 * together (a broker outage) do not all come back at the same instant.
 */
export function retryDelay(
  attempt: number,
  retry: Pick<ResolvedRetryPolicy, 'baseDelayMs' | 'maxDelayMs'>,
  random: () => number = Math.random,
): number {
  const ceiling = Math.min(retry.maxDelayMs, retry.baseDelayMs * 2 ** Math.min(attempt - 1, 40));
  return Math.round(ceiling / 2 + (random() * ceiling) / 2);
}

/** A short, single-line account of an error for `last_error`. */
export function describeError(error: unknown): string {
  const text = (
    error instanceof Error ? `${error.name}: ${error.message}` : `thrown: ${textOf(error)}`
  )
    .split('\u0000') // PostgreSQL text cannot hold NUL
    .join('');
  return text.length > 2000 ? `${text.slice(0, 1997)}...` : text;
}

/**
 * What becomes of a record whose attempt failed with `error`: retried later, or `FAILED` once
 * `retry.attempts` attempts were made (or at once when `final`: an error no retry can fix).
 */
export function failedAttempt(
  record: Pick<StoredRecord, 'id' | 'attempts'>,
  error: unknown,
  now: number,
  options: Pick<ResolvedBoxOptions, 'retry'>,
  final = false,
): RecordOutcome {
  const attempt = record.attempts + 1;
  const reason = describeError(error);
  if (final || attempt >= options.retry.attempts) {
    return { id: record.id, status: 'failed', error: reason };
  }
  return {
    id: record.id,
    status: 'retry',
    nextAttemptAt: now + retryDelay(attempt, options.retry),
    error: reason,
  };
}
