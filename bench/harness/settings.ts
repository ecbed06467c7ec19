/**
 * A benchmark's settings, from environment variables: the servers' URLs and the `BENCH_*`
 * knobs. Each read names its default and what it accepts; a value that does not fit stops the
 * benchmark before it starts, with the variable, the value and what was expected. Unset and empty
 * mean the default.
 */

/** A setting's value does not fit what the benchmark accepts. */
export class BenchSettingError extends Error {
  override readonly name = 'BenchSettingError';

  constructor(
    readonly variable: string,
    readonly value: string,
    readonly expected: string,
  ) {
    super(`${variable}=${JSON.stringify(value)}: expected ${expected}`);
  }
}

/**
 * Reads a benchmark's settings with `read`; a value that does not fit ends the process before
 * anything starts, with the variable, the value and what was expected on stderr (exit code 1).
 */
export function readSettings<T>(read: () => T): T {
  try {
    return read();
  } catch (error) {
    if (!(error instanceof BenchSettingError)) throw error;
    process.stderr.write(`${error.message}\n`);
    process.exit(1);
  }
}

/** The variable's value, trimmed; undefined when unset or empty. */
export function textSetting(name: string): string | undefined {
  const value = process.env[name]?.trim();
  return value === undefined || value === '' ? undefined : value;
}

interface NumberRule {
  /** Whole numbers only. */
  readonly integer?: boolean;
  /** Zero allowed (otherwise the value must be above zero). */
  readonly zero?: boolean;
}

function numberSetting(name: string, fallback: number, rule: NumberRule): number {
  const text = textSetting(name);
  if (text === undefined) return fallback;
  const value = Number(text);
  const kind = rule.integer ? 'integer' : 'number';
  const expected = rule.zero ? `a ${kind} of 0 or more` : `a positive ${kind}`;
  if (!Number.isFinite(value) || (rule.integer && !Number.isSafeInteger(value))) {
    throw new BenchSettingError(name, text, expected);
  }
  if (value < 0 || (value === 0 && !rule.zero)) throw new BenchSettingError(name, text, expected);
  return value;
}

/** A number above zero (sizes in MiB, seconds, intervals). */
export const positiveNumber = (name: string, fallback: number) => numberSetting(name, fallback, {});

/** A whole number above zero (rounds, counts, prefetch). */
export const positiveInteger = (name: string, fallback: number) =>
  numberSetting(name, fallback, { integer: true });

/** A number of zero or more. */
export const nonNegativeNumber = (name: string, fallback: number) =>
  numberSetting(name, fallback, { zero: true });

/** A whole number above zero, or undefined when unset (the library's default then applies). */
export function optionalPositiveInteger(name: string): number | undefined {
  return textSetting(name) === undefined ? undefined : positiveInteger(name, 0);
}

/** `0` is off, any other number on. */
export function switchSetting(name: string, fallback: boolean): boolean {
  return nonNegativeNumber(name, fallback ? 1 : 0) !== 0;
}

/** One of `choices`. */
export function choiceSetting<T extends string>(
  name: string,
  choices: readonly T[],
  fallback: T,
): T {
  const text = textSetting(name);
  if (text === undefined) return fallback;
  if (!(choices as readonly string[]).includes(text)) {
    throw new BenchSettingError(name, text, `one of ${choices.join(', ')}`);
  }
  return text as T;
}

/** Comma-separated items, each one of `choices`; all of them when unset. */
export function subsetSetting<T extends string>(name: string, choices: readonly T[]): Set<T> {
  const text = textSetting(name);
  if (text === undefined) return new Set(choices);
  const items = text.split(',').map((item) => item.trim());
  const unknown = items.filter((item) => !(choices as readonly string[]).includes(item));
  if (unknown.length > 0) {
    throw new BenchSettingError(name, text, `a comma-separated list of ${choices.join(', ')}`);
  }
  return new Set(items as T[]);
}

/**
 * Comma-separated positive numbers (empty items skipped). Unlike the other settings, an empty
 * value is kept as an empty list: it leaves out what the list would have selected.
 */
export function positiveNumberList(name: string, fallback: string): number[] {
  const text = process.env[name] ?? fallback;
  const items = text.split(',').filter((item) => item.trim() !== '');
  const values = items.map(Number);
  if (values.some((value) => !(Number.isFinite(value) && value > 0))) {
    throw new BenchSettingError(name, text, 'a comma-separated list of positive numbers');
  }
  return values;
}

/** Whitespace-separated words (command-line options). */
export function wordsSetting(name: string): string[] {
  return (textSetting(name) ?? '').split(/\s+/).filter(Boolean);
}

/** `A=1,B=2` → { A: '1', B: '2' }: environment variables for child processes. */
export function envPairsSetting(name: string): Record<string, string> {
  const text = textSetting(name) ?? '';
  const env: Record<string, string> = {};
  for (const pair of text.split(',').filter((item) => item.trim() !== '')) {
    const match = /^\s*([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(pair);
    if (!match) throw new BenchSettingError(name, text, 'comma-separated NAME=VALUE pairs');
    env[match[1]] = match[2].trim();
  }
  return env;
}

/** The local servers, as DEVELOPERS.md lists them, unless the environment says otherwise. */
export const servers = {
  get amqpUrl(): string {
    return textSetting('AMQP_URL') ?? 'amqp://guest:guest@127.0.0.1:5672';
  },
  get redisUrl(): string {
    return textSetting('REDIS_URL') ?? 'redis://127.0.0.1:6379';
  },
  get natsUrl(): string {
    return textSetting('NATS_URL') ?? 'nats://127.0.0.1:4222';
  },
  get databaseUrl(): string {
    return textSetting('DATABASE_URL') ?? 'postgres://postgres:postgres@127.0.0.1:5432/test';
  },
};

/**
 * `BENCH_UNSAFE_SOCKET_TRICKS`: the values of the adapters' `unsafeSocketTricks` a benchmark runs
 * its module path with, in order. `off` (the default): without; `on`: with; `both`: without, then
 * with, each against its own baseline rounds and reported on a line of its own.
 */
export function socketTrickVariants(): boolean[] {
  const value = choiceSetting('BENCH_UNSAFE_SOCKET_TRICKS', ['off', 'on', 'both'], 'off');
  return value === 'both' ? [false, true] : [value === 'on'];
}
