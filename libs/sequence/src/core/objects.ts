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
