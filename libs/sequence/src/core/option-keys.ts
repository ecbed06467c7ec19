import { SequenceOptionsError } from './errors/sequence-options.error';

/**
 * Refusing the keys of an options object that are not options, shared by the module's options
 * (`options/option-keys.ts`) and the adapters' own: a misspelt or renamed option would otherwise
 * keep its default without a word, and TypeScript does not catch an extra key in an object that
 * is not a literal (a spread, a config object, plain JavaScript).
 */

/** Options that were renamed or moved, by their old path: where they are now. */
export type Renames = Readonly<Record<string, string>>;

/**
 * The top-level keys of an options type `T`: a key list declared
 * `{ ... } as const satisfies OptionKeysOf<T>` compiles only if it holds exactly `T`'s keys.
 */
export type OptionKeysOf<T> = { readonly [K in keyof T]-?: true };

/**
 * An object whose own keys are all options: a literal. An instance of a class (a config class)
 * may hold other fields (injected services, fields left undefined) and give its options through
 * getters: its keys are left unchecked.
 */
export function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
  const prototype = Object.getPrototypeOf(value) as unknown;
  return prototype === Object.prototype || prototype === null;
}

/**
 * What a value given where an object was expected is, for an error message: its kind only, never
 * its content (it may be a key or a password put in the wrong place).
 */
export function kindOf(value: unknown): string {
  if (value === null || value === undefined) return String(value);
  if (Array.isArray(value)) return 'an array';
  return `${typeof value === 'object' ? 'an' : 'a'} ${typeof value}`;
}

/**
 * The problem with `path`, a key that the options at `at` (`''` for the top level), whose keys
 * are `keys`, do not have: what replaced it when it was renamed, else the keys there are.
 */
export function unknownKeyProblem(
  path: string,
  at: string,
  keys: readonly string[],
  renames: Renames = {},
): string {
  const renamed = renames[path];
  return renamed
    ? `${path} is no longer an option: use ${renamed}`
    : `${path} is not an option; ${at ? `${at} takes` : 'the options are'} ${keys.join(', ')}`;
}

/**
 * Adds a problem to `problems` for each top-level key of an adapter's `options` that `keys`
 * lacks. The values are not looked into: options nested there may be another library's (ioredis,
 * pg, the S3 client), which that library checks.
 */
export function checkOptionKeys(
  problems: string[],
  options: unknown,
  keys: object,
  renames: Renames = {},
  /** Where `options` sit (`sequence`), for the problems' paths; none: at the top. */
  at = '',
): void {
  if (!isPlainObject(options)) return;
  const known = Object.keys(keys);
  for (const key of Object.keys(options)) {
    if (!known.includes(key)) {
      problems.push(unknownKeyProblem(at ? `${at}.${key}` : key, at, known, renames));
    }
  }
}

/**
 * {@link checkOptionKeys}, throwing a {@link SequenceOptionsError} that lists every unknown key:
 * for an adapter's constructor, before it opens anything.
 */
export function refuseUnknownKeys(
  where: string,
  options: unknown,
  keys: object,
  renames: Renames = {},
): void {
  const problems: string[] = [];
  checkOptionKeys(problems, options, keys, renames);
  if (problems.length > 0) throw new SequenceOptionsError(where, problems);
}
