import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { checkDelay, checkOneOf } from '../core/option-checks';
import { checkOptionKeys, type OptionKeysOf } from '../core/option-keys';

/** Thresholds of one box (the outbox, or the inbox). */
export interface BoxHealthThresholds {
  /**
   * Down when the oldest `PENDING` record is older than this (ms): the relay (outbox) or the
   * handlers (inbox) do not keep up, or do not run. `false`: never.
   * @default 300_000 (5 minutes)
   */
  readonly lagMs?: number | false;
  /**
   * Down when more than this many records are `FAILED`: they wait for an operator to retry or
   * discard them. `false`: never.
   * @default 0 (any failed record)
   */
  readonly failed?: number | false;
}

/**
 * Options of `SequenceHealthModule.forRoot`: the thresholds past which an indicator reports down,
 * and when it warns before that. Every threshold is a limit on a value the indicator reports;
 * `false` turns it off.
 *
 * @example
 * SequenceHealthModule.forRoot({
 *   sequence: { bufferPercent: 90 },
 *   outbox: { lagMs: 60_000, failed: false },
 * })
 */
export interface SequenceHealthOptions {
  /**
   * A value at or above this fraction of its limit (and not past it) is listed in the
   * indicator's `warnings`, which leave it up: time to look before it goes down. A number
   * above 0 and below 1, or `false` for no warnings.
   * @default 0.8
   */
  readonly warnRatio?: number | false;
  readonly sequence?: {
    /**
     * Down when stored and reserved bytes together reach this percent of
     * `sequence.maxBufferedBytes` (new sequences are back-pressured once they would pass 100).
     * Above 0, at most 100.
     * @default 80
     */
    readonly bufferPercent?: number | false;
    /**
     * Down when the oldest open sequence is older than this (ms). `'timeout'`: the module's
     * `sequence.timeoutMs` plus one expiry sweep interval, past which a `fixed` timeout should
     * have expired it. With a `sliding` timeout, or channels with longer timeouts of their own,
     * a sequence still receiving fragments may be older: give a number.
     * @default 'timeout'
     */
    readonly oldestOpenAgeMs?: number | 'timeout' | false;
  };
  readonly resequencer?: {
    /**
     * Down when a resequencer's oldest gap is older than this (ms). `'timeout'`: that
     * resequencer's `gap.timeoutMs` plus one gap sweep interval, past which its gap policy
     * should have applied (with the `'alert'` policy the gap stays open after the alert: an
     * event is missing until someone acts).
     * @default 'timeout'
     */
    readonly oldestGapAgeMs?: number | 'timeout' | false;
    /** Down when a resequencer has more keys than this waiting on a gap. @default false */
    readonly openGaps?: number | false;
  };
  /** Thresholds of the outbox, judged for each of its boxes (events, commands). */
  readonly outbox?: BoxHealthThresholds;
  /** Thresholds of the inbox, judged for each of its boxes (events, commands). */
  readonly inbox?: BoxHealthThresholds;
}

/** A limit as resolved: a number, `'timeout'` (resolved per check), or `undefined` for none. */
export type ResolvedLimit = number | 'timeout' | undefined;

/** {@link SequenceHealthOptions} with every default applied and every value checked. */
export interface ResolvedHealthOptions {
  /** `undefined`: no warnings. */
  readonly warnRatio: number | undefined;
  readonly sequence: {
    readonly bufferPercent: number | undefined;
    readonly oldestOpenAgeMs: ResolvedLimit;
  };
  readonly resequencer: {
    readonly oldestGapAgeMs: ResolvedLimit;
    readonly openGaps: number | undefined;
  };
  readonly outbox: ResolvedBoxThresholds;
  readonly inbox: ResolvedBoxThresholds;
}

export interface ResolvedBoxThresholds {
  readonly lagMs: number | undefined;
  readonly failed: number | undefined;
}

/** The one home of the health thresholds' defaults; the `@default`s above say the same. */
export const HEALTH_DEFAULTS = {
  warnRatio: 0.8,
  sequence: { bufferPercent: 80, oldestOpenAgeMs: 'timeout' },
  resequencer: { oldestGapAgeMs: 'timeout', openGaps: false },
  box: { lagMs: 300_000, failed: 0 },
} as const;

/**
 * The keys each object of {@link SequenceHealthOptions} takes: a misspelt threshold is refused
 * rather than left at its default without a word.
 */
const HEALTH_KEYS = {
  warnRatio: true,
  sequence: true,
  resequencer: true,
  outbox: true,
  inbox: true,
} as const satisfies OptionKeysOf<SequenceHealthOptions>;
const SECTION_KEYS = {
  sequence: { bufferPercent: true, oldestOpenAgeMs: true } as const satisfies OptionKeysOf<
    NonNullable<SequenceHealthOptions['sequence']>
  >,
  resequencer: { oldestGapAgeMs: true, openGaps: true } as const satisfies OptionKeysOf<
    NonNullable<SequenceHealthOptions['resequencer']>
  >,
  outbox: { lagMs: true, failed: true } as const satisfies OptionKeysOf<BoxHealthThresholds>,
  inbox: { lagMs: true, failed: true } as const satisfies OptionKeysOf<BoxHealthThresholds>,
} as const;

/** Injection token of the {@link ResolvedHealthOptions}. */
export const HEALTH_OPTIONS = Symbol('nest-sequence:health-options');

/**
 * Applies the defaults and checks every value.
 * @throws SequenceOptionsError listing every bad value and what to give instead
 */
export function resolveHealthOptions(options: SequenceHealthOptions = {}): ResolvedHealthOptions {
  const problems: string[] = [];
  // Checked as what it may be at run time: JavaScript callers pass anything.
  const given: SequenceHealthOptions = options ?? {};
  checkOptionKeys(problems, given, HEALTH_KEYS);
  const section = <T extends object>(
    name: keyof typeof SECTION_KEYS,
    value: T | undefined,
  ): Partial<T> => {
    if (value === undefined) return {};
    if (typeof value === 'object' && value !== null && !Array.isArray(value)) {
      checkOptionKeys(problems, value, SECTION_KEYS[name], {}, name);
      return value;
    }
    problems.push(`${name} must be an object, got ${describe(value)}`);
    return {};
  };
  // In the options' order, so that the problems read as the options do.
  const warnRatio = ratio(problems, given.warnRatio);
  const sequence = section('sequence', given.sequence);
  const resolvedSequence = {
    bufferPercent: percent(problems, sequence.bufferPercent),
    oldestOpenAgeMs: age(
      problems,
      'sequence.oldestOpenAgeMs',
      sequence.oldestOpenAgeMs,
      HEALTH_DEFAULTS.sequence.oldestOpenAgeMs,
    ),
  };
  const resequencer = section('resequencer', given.resequencer);
  const resolvedResequencer = {
    oldestGapAgeMs: age(
      problems,
      'resequencer.oldestGapAgeMs',
      resequencer.oldestGapAgeMs,
      HEALTH_DEFAULTS.resequencer.oldestGapAgeMs,
    ),
    openGaps: count(
      problems,
      'resequencer.openGaps',
      resequencer.openGaps,
      HEALTH_DEFAULTS.resequencer.openGaps,
      0,
    ),
  };
  const box = (name: 'outbox' | 'inbox'): ResolvedBoxThresholds => {
    const thresholds = section(name, given[name]);
    return {
      lagMs: count(problems, `${name}.lagMs`, thresholds.lagMs, HEALTH_DEFAULTS.box.lagMs, 1),
      failed: count(problems, `${name}.failed`, thresholds.failed, HEALTH_DEFAULTS.box.failed, 0),
    };
  };
  const resolved: ResolvedHealthOptions = {
    warnRatio,
    sequence: resolvedSequence,
    resequencer: resolvedResequencer,
    outbox: box('outbox'),
    inbox: box('inbox'),
  };
  if (problems.length > 0) throw new SequenceOptionsError('SequenceHealthModule options', problems);
  return resolved;
}

function ratio(problems: string[], value: unknown): number | undefined {
  if (value === undefined) return HEALTH_DEFAULTS.warnRatio;
  if (value === false) return undefined;
  if (typeof value === 'number' && value > 0 && value < 1) return value;
  problems.push(
    `warnRatio must be a number above 0 and below 1 (0.8 warns at 80% of each limit), or false ` +
      `for no warnings; got ${describe(value)}`,
  );
  return undefined;
}

function percent(problems: string[], value: unknown): number | undefined {
  if (value === undefined) return HEALTH_DEFAULTS.sequence.bufferPercent;
  if (value === false) return undefined;
  if (typeof value === 'number' && value > 0 && value <= 100) return value;
  problems.push(
    `sequence.bufferPercent must be a percent above 0 and at most 100, or false; got ${describe(value)}`,
  );
  return undefined;
}

function age(
  problems: string[],
  name: string,
  value: unknown,
  fallback: number | 'timeout' | false,
): ResolvedLimit {
  const chosen = value === undefined ? fallback : value;
  if (chosen === false) return undefined;
  if (chosen === 'timeout' || (Number.isSafeInteger(chosen) && (chosen as number) >= 1)) {
    return chosen as number | 'timeout';
  }
  problems.push(
    `${name} must be a whole number of ms of at least 1, 'timeout' or false; got ${describe(value)}`,
  );
  return undefined;
}

function count(
  problems: string[],
  name: string,
  value: unknown,
  fallback: number | false,
  min: 0 | 1,
): number | undefined {
  const chosen = value === undefined ? fallback : value;
  if (chosen === false) return undefined;
  if (Number.isSafeInteger(chosen) && (chosen as number) >= min) return chosen as number;
  const what = name.endsWith('Ms') ? 'a whole number of ms' : 'a whole number';
  problems.push(`${name} must be ${what} of at least ${min}, or false; got ${describe(value)}`);
  return undefined;
}

function describe(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (value === null) return 'null';
  return Array.isArray(value) ? 'an array' : typeof value;
}

/** How long each ping or read of one `isHealthy` call may take, unless it says otherwise. */
const DEFAULT_CHECK_TIMEOUT_MS = 1_000;

/** The options of one indicator's `isHealthy` call, checked, with their defaults. */
export interface ResolvedHealthCheck {
  readonly timeoutMs: number;
  readonly thresholds: boolean;
}

/**
 * The options of one `isHealthy` call: `timeoutMs` a whole number of milliseconds from 1 to
 * 2^31 - 1 (a timer's longest; default 1000), `thresholds` true or false (default true). A
 * negative or NaN time limit would report every dependency down; a string `'false'` would judge
 * the thresholds it meant to turn off.
 * @throws SequenceOptionsError naming `where` (the indicator's call) and every problem
 */
export function resolveHealthCheck(where: string, options: unknown): ResolvedHealthCheck {
  if (options === undefined) return { timeoutMs: DEFAULT_CHECK_TIMEOUT_MS, thresholds: true };
  const problems: string[] = [];
  if (typeof options !== 'object' || options === null || Array.isArray(options)) {
    throw new SequenceOptionsError(where, [
      `the options must be an object, got ${describe(options)}`,
    ]);
  }
  checkOptionKeys(problems, options, { timeoutMs: true, thresholds: true });
  const { timeoutMs = DEFAULT_CHECK_TIMEOUT_MS, thresholds = true } = options as {
    timeoutMs?: unknown;
    thresholds?: unknown;
  };
  checkDelay(problems, 'timeoutMs', timeoutMs, 1);
  checkOneOf(problems, 'thresholds', thresholds, [true, false]);
  if (problems.length > 0) throw new SequenceOptionsError(where, problems);
  return { timeoutMs: timeoutMs as number, thresholds: thresholds as boolean };
}
