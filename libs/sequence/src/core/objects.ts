/**
 * `value` without its `undefined` entries, so that spreading it over defaults treats
 * `{ prefetch: undefined }` as "the default", as if the key were absent.
 */
export function definedOnly<T extends object>(value: T): Partial<T> {
  return Object.fromEntries(
    Object.entries(value).filter(([, entry]) => entry !== undefined),
  ) as Partial<T>;
}

/** Whether `value` is a plain object whose values are all strings (stored user metadata). */
export function isStringRecord(value: unknown): value is Record<string, string> {
  return (
    typeof value === 'object' &&
    value !== null &&
    !Array.isArray(value) &&
    Object.values(value).every((entry) => typeof entry === 'string')
  );
}

/**
 * Adds `value` to `recent` as its newest entry (a Set keeps insertion order), then drops the
 * oldest while more than `max` are kept: a memory of the latest values, bounded.
 */
export function rememberRecent<T>(recent: Set<T>, value: T, max: number): void {
  recent.delete(value);
  recent.add(value);
  forgetOldest(recent, max);
}

/** {@link rememberRecent} for a Map: `key` with `value` as its newest entry, at most `max` kept. */
export function rememberRecentEntry<K, V>(recent: Map<K, V>, key: K, value: V, max: number): void {
  recent.delete(key);
  recent.set(key, value);
  forgetOldest(recent, max);
}

/** Drops the oldest entries of `recent` (insertion order) while more than `max` are kept. */
function forgetOldest<K>(recent: Set<K> | Map<K, unknown>, max: number): void {
  while (recent.size > max) {
    const [oldest] = recent.keys();
    recent.delete(oldest);
  }
}

/** What `value` is, for an error message: `null`, its class's name, or its `typeof`. */
export function kindOf(value: unknown): string {
  if (value === null) return 'null';
  return typeof value === 'object' ? (value.constructor?.name ?? 'an object') : typeof value;
}
