/**
 * `value` without its `undefined` entries, so that spreading it over defaults treats
 * `{ prefetch: undefined }` as "the default", as if the key were absent.
 */
export function definedOnly<T extends object>(value: T): Partial<T> {
  return Object.fromEntries(
    Object.entries(value).filter(([, entry]) => entry !== undefined),
  ) as Partial<T>;
}
