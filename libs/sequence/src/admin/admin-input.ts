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

/** `{ ids: string[] }`: 1 to `maxBatch` distinct ids. */
export function parseIds(body: unknown, maxBatch: number): string[] {
  const ids = (body as { ids?: unknown } | undefined)?.ids;
  if (!Array.isArray(ids) || ids.length === 0 || ids.length > maxBatch) {
    throw badRequest(`the body must be { "ids": [...] } with 1 to ${maxBatch} ids`);
  }
  for (const id of ids) parseText('every id', id, 512);
  return [...new Set(ids as string[])];
}

/** `{ ids }`, `{ reason }` or `{ all: true }`: exactly one of them. */
export function parseSelection(body: unknown, maxBatch: number): DeadLetterSelection {
  const given = (body ?? {}) as { ids?: unknown; reason?: unknown; all?: unknown };
  const chosen = [given.ids !== undefined, given.reason !== undefined, given.all !== undefined];
  if (typeof body !== 'object' || body === null || chosen.filter(Boolean).length !== 1) {
    throw badRequest(
      'the body must hold exactly one of { "ids": [...] }, { "reason": "..." }, { "all": true }',
    );
  }
  if (given.ids !== undefined) return { kind: 'ids', ids: parseIds(given, maxBatch) };
  if (given.reason !== undefined)
    return { kind: 'reason', reason: parseText('reason', given.reason) };
  if (given.all !== true) throw badRequest('all must be true when given');
  return { kind: 'all' };
}
