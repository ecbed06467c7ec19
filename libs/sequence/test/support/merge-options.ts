/**
 * `overrides` merged into `base`, property by property, plain objects recursively (a builder's
 * defaults under what a test gives, or a test's options under what a builder must force).
 * Anything that is not a plain object (an adapter, a registry, an array, a function) is taken as
 * it is.
 */
export function mergeOptions<T extends object>(base: T, overrides: T): T {
  const merged: Record<string, unknown> = { ...(base as Record<string, unknown>) };
  for (const [key, value] of Object.entries(overrides)) {
    if (value === undefined) continue;
    const current = merged[key];
    merged[key] =
      isPlainObject(current) && isPlainObject(value) ? mergeOptions(current, value) : value;
  }
  return merged as T;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return (
    typeof value === 'object' && value !== null && Object.getPrototypeOf(value) === Object.prototype
  );
}
