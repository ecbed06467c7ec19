import { MESSAGE_ID_PATTERN } from '../core/outbox-message';
import { hasLoneSurrogate } from '../core/unicode';
import { isResequencerKey } from '../ports/resequencer-store.port';
import { badRequest } from './admin.errors';

/** What a dead-letter action addresses: these ids, the first of one reason, or the first of all. */
export type DeadLetterSelection =
  | { readonly kind: 'ids'; readonly ids: readonly string[] }
  | { readonly kind: 'reason'; readonly reason: string }
  | { readonly kind: 'all' };

/** A `?limit=` as an integer from 1 to `max`; `fallback` when absent. */
export function parseLimit(raw: unknown, max: number, fallback = Math.min(100, max)): number {
  if (raw === undefined || raw === '') return fallback;
  const value = typeof raw === 'string' && /^\d+$/.test(raw) ? Number(raw) : Number.NaN;
  if (!Number.isSafeInteger(value) || value < 1 || value > max) {
    throw badRequest(`limit must be an integer from 1 to ${max}, got ${JSON.stringify(raw)}`);
  }
  return value;
}

/** A non-empty string of at most `max` characters (a channel, an id, a reason). */
export function parseText(name: string, raw: unknown, max = 512): string {
  if (typeof raw !== 'string' || raw.length === 0 || raw.length > max) {
    throw badRequest(`${name} must be a string of 1 to ${max} characters`);
  }
  return raw;
}

/** An optional query value: undefined when absent or empty. */
export function optionalText(name: string, raw: unknown, max = 512): string | undefined {
  return raw === undefined || raw === '' ? undefined : parseText(name, raw, max);
}

/**
 * A dead-letter reason filter: a reason code or a whole reason, at most 512 characters. `''`
 * names the dead letters without a reason (the group `GET dead-letters/:channel/reasons` lists as
 * `""`); an absent one (undefined) filters nothing.
 */
export function optionalReason(raw: unknown): string | undefined {
  if (raw === undefined) return undefined;
  if (typeof raw !== 'string' || raw.length > 512) {
    throw badRequest('reason must be a string of at most 512 characters ("" for no reason)');
  }
  return raw;
}

/**
 * Whether `value` can be an outbox or inbox row's id: a message id, 1 to 200 characters without
 * control characters or a lone surrogate (what recording or receiving a message requires of its
 * id; the stores refuse the surrogate).
 */
export function isRowId(value: unknown): value is string {
  return typeof value === 'string' && MESSAGE_ID_PATTERN.test(value) && !hasLoneSurrogate(value);
}

/** A resequencer key as the stores take it: 1 to 256 characters without control characters. */
export function parseResequencerKey(raw: unknown): string {
  if (!isResequencerKey(raw)) {
    throw badRequest(
      `key ${shown(raw)} must be 1 to 256 characters without control characters ` +
        '(what a resequencer key is)',
    );
  }
  return raw;
}

/**
 * A gap action's body: `{}` (or none), or `{ since }`, the gap's `since` as listed (ms since the
 * epoch), so that only that gap is skipped, not one that opened after the operator looked.
 */
export function parseGapSince(body: unknown): number | undefined {
  const since = (body as { since?: unknown } | undefined)?.since;
  if (since === undefined) return undefined;
  if (typeof since !== 'number' || !Number.isSafeInteger(since) || since < 0) {
    throw badRequest(
      `since must be the gap's since as listed (ms since the epoch), got ${shown(since)}`,
    );
  }
  return since;
}

/** `{ ids: string[] }` of outbox or inbox rows: 1 to `maxBatch` distinct row ids. */
export function parseIds(body: unknown, maxBatch: number): string[] {
  const ids = idList(body, maxBatch);
  for (const id of ids) {
    if (!isRowId(id)) {
      throw badRequest(
        `every id must be 1 to 200 characters without control characters or a lone surrogate ` +
          `(what an outbox or inbox row's id is); ${shown(id)} is not`,
      );
    }
  }
  return [...new Set(ids as string[])];
}

/** `{ ids: string[] }` of dead letters: 1 to `maxBatch` distinct ids of 1 to 512 characters. */
function parseDeadLetterIds(body: unknown, maxBatch: number): string[] {
  const ids = idList(body, maxBatch);
  for (const id of ids) parseText('every id', id, 512);
  return [...new Set(ids as string[])];
}

function idList(body: unknown, maxBatch: number): unknown[] {
  const ids = (body as { ids?: unknown } | undefined)?.ids;
  if (!Array.isArray(ids) || ids.length === 0 || ids.length > maxBatch) {
    throw badRequest(`the body must be { "ids": [...] } with 1 to ${maxBatch} ids`);
  }
  return ids;
}

/** A value for a message: JSON, its first 60 characters. */
function shown(value: unknown): string {
  const text = JSON.stringify(value) ?? String(value);
  return text.length > 60 ? `${text.slice(0, 60)}…` : text;
}

/**
 * `{ ids }`, `{ reason }` or `{ all: true }`: exactly one of them. `{ "reason": "" }` addresses
 * the dead letters without a reason.
 */
export function parseSelection(body: unknown, maxBatch: number): DeadLetterSelection {
  const given = (body ?? {}) as { ids?: unknown; reason?: unknown; all?: unknown };
  const chosen = [given.ids !== undefined, given.reason !== undefined, given.all !== undefined];
  if (typeof body !== 'object' || body === null || chosen.filter(Boolean).length !== 1) {
    throw badRequest(
      'the body must hold exactly one of { "ids": [...] }, { "reason": "..." }, { "all": true }',
    );
  }
  if (given.ids !== undefined) return { kind: 'ids', ids: parseDeadLetterIds(given, maxBatch) };
  if (given.reason !== undefined) {
    return { kind: 'reason', reason: optionalReason(given.reason) ?? '' };
  }
  if (given.all !== true) throw badRequest('all must be true when given');
  return { kind: 'all' };
}
