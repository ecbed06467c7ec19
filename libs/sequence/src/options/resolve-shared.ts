import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { SEQUENCE_ID_PATTERN } from '../core/headers';
import { definedOnly } from '../core/objects';
import { kindOf } from '../core/option-keys';
import { checkDelay, checkInteger, checkInterval } from '../core/option-checks';
import { DEFAULTS } from './defaults';
import type {
  MetricsOptions,
  PublishPolicy,
  TracingOptions,
  RetryPolicy,
  SequenceModuleOptions,
  SweeperOptions,
  TuningOptions,
} from './module-options';
import type {
  ResolvedTracing,
  ResolvedPublishPolicy,
  ResolvedRetryPolicy,
  ResolvedSweeper,
  ResolvedTuning,
} from './resolved-options';

/** `given` over `base`, each field checked; problems name the option `at` (e.g. `publish.retry`). */
export function resolveRetryPolicy(
  problems: string[],
  at: string,
  given: RetryPolicy | undefined,
  base: ResolvedRetryPolicy,
): ResolvedRetryPolicy {
  if (given !== undefined && (typeof given !== 'object' || given === null)) {
    problems.push(`${at} must be { attempts?, baseDelayMs?, maxDelayMs? }`);
    return base;
  }
  // Nothing given: the base is what applies, and it was checked where it was given.
  if (given === undefined) return base;
  const policy = { ...base, ...definedOnly(given ?? {}) };
  checkInteger(problems, `${at}.attempts`, policy.attempts, 1);
  checkDelay(problems, `${at}.baseDelayMs`, policy.baseDelayMs, 0);
  if (checkDelay(problems, `${at}.maxDelayMs`, policy.maxDelayMs, 0)) {
    if (Number.isSafeInteger(policy.baseDelayMs) && policy.maxDelayMs < policy.baseDelayMs) {
      problems.push(
        `${at}.maxDelayMs (${policy.maxDelayMs}) is below baseDelayMs (${policy.baseDelayMs}); ` +
          'raise maxDelayMs or lower baseDelayMs',
      );
    }
  }
  return policy;
}

/**
 * A handler's time limit: `given` over `base` (the module's), `false` for none; checked as a
 * timer's delay (an integer from 1 ms). `undefined` in the result: no limit.
 */
export function resolveHandlerTimeout(
  problems: string[],
  at: string,
  given: number | false | undefined,
  base: number | undefined,
): number | undefined {
  if (given === undefined) return base;
  if (given === false) return undefined;
  if (!checkDelay(problems, at, given, 1)) return base;
  return given;
}

/** A publish policy: `given` over `base` (the module's, or the defaults), each field checked. */
export function resolvePublishPolicy(
  problems: string[],
  at: string,
  given: PublishPolicy | undefined,
  base: ResolvedPublishPolicy,
): ResolvedPublishPolicy {
  const { retry, ...rest } = given ?? {};
  const publish = { ...base, ...definedOnly(rest) };
  checkDelay(problems, `${at}.confirmTimeoutMs`, publish.confirmTimeoutMs, 1);
  checkInteger(problems, `${at}.inFlight`, publish.inFlight, 1);
  return {
    confirmTimeoutMs: publish.confirmTimeoutMs,
    inFlight: publish.inFlight,
    retry: resolveRetryPolicy(problems, `${at}.retry`, retry, base.retry),
  };
}

function resolveSweeper(
  problems: string[],
  name: keyof ResolvedTuning['sweepers'],
  given: SweeperOptions | undefined,
): ResolvedSweeper {
  const at = `tuning.sweepers.${name}`;
  const sweeper = { ...DEFAULTS.tuning.sweepers[name], ...definedOnly(given ?? {}) };
  checkInterval(problems, `${at}.intervalMs`, sweeper.intervalMs, 1);
  checkInteger(problems, `${at}.batchSize`, sweeper.batchSize, 1);
  return sweeper;
}

export function resolveTuning(
  problems: string[],
  given: TuningOptions | undefined,
): ResolvedTuning {
  const tuning = given ?? {};
  const defaults = DEFAULTS.tuning;
  const resolved: ResolvedTuning = {
    headerAllowanceBytes: tuning.headerAllowanceBytes ?? defaults.headerAllowanceBytes,
    backpressureDelayMs: tuning.backpressureDelayMs ?? defaults.backpressureDelayMs,
    leaseMs: tuning.leaseMs ?? defaults.leaseMs,
    storeTimeoutMs: tuning.storeTimeoutMs ?? defaults.storeTimeoutMs,
    maxStoreRequeues: tuning.maxStoreRequeues ?? defaults.maxStoreRequeues,
    drain: { ...defaults.drain, ...definedOnly(tuning.drain ?? {}) },
    sweepers: {
      expiry: resolveSweeper(problems, 'expiry', tuning.sweepers?.expiry),
      orphans: resolveSweeper(problems, 'orphans', tuning.sweepers?.orphans),
      gaps: resolveSweeper(problems, 'gaps', tuning.sweepers?.gaps),
      purge: resolveSweeper(problems, 'purge', tuning.sweepers?.purge),
    },
  };
  checkInteger(problems, 'tuning.headerAllowanceBytes', resolved.headerAllowanceBytes, 0);
  checkDelay(problems, 'tuning.backpressureDelayMs', resolved.backpressureDelayMs, 1);
  checkDelay(problems, 'tuning.leaseMs', resolved.leaseMs, 100);
  checkDelay(problems, 'tuning.storeTimeoutMs', resolved.storeTimeoutMs, 1);
  checkInteger(problems, 'tuning.maxStoreRequeues', resolved.maxStoreRequeues, 0);
  checkInteger(problems, 'tuning.drain.batchSize', resolved.drain.batchSize, 1);
  checkDelay(problems, 'tuning.drain.waitMs', resolved.drain.waitMs, 0);
  return resolved;
}

export function resolveMetrics(
  problems: string[],
  given: false | MetricsOptions | undefined,
): false | { registry?: MetricsOptions['registry']; prefix: string } {
  if (given === false) return false;
  const prefix = given?.prefix ?? DEFAULTS.metricsPrefix;
  // RegExp.test turns what it is given into a string: `true` would pass as 'true'.
  if (typeof prefix !== 'string' || !/^([a-zA-Z_:][a-zA-Z0-9_:]*)?$/.test(prefix)) {
    problems.push(
      'metrics.prefix must be empty or a Prometheus metric name (letters, digits, _ and :, not ' +
        `starting with a digit), got ${JSON.stringify(prefix)}`,
    );
  }
  const registry: unknown = given?.registry;
  if (registry !== undefined && !isRegistry(registry)) {
    // A TypeError from prom-client at the first metric would say neither which option nor why.
    problems.push(
      'metrics.registry must be a prom-client Registry (registerMetric, getSingleMetric, ' +
        'removeSingleMetric, metrics), got ' +
        (typeof registry === 'object' && registry !== null && !Array.isArray(registry)
          ? 'an object without them'
          : kindOf(registry)),
    );
  }
  return { registry: given?.registry, prefix };
}

/** The methods of a prom-client `Registry` the module calls: another copy of prom-client's will do. */
const REGISTRY_METHODS = ['registerMetric', 'getSingleMetric', 'removeSingleMetric', 'metrics'];

function isRegistry(value: unknown): boolean {
  return (
    typeof value === 'object' &&
    value !== null &&
    REGISTRY_METHODS.every(
      (method) => typeof (value as Record<string, unknown>)[method] === 'function',
    )
  );
}

export function resolveTracing(
  problems: string[],
  given: false | TracingOptions | undefined,
): ResolvedTracing {
  const parent = (given || undefined)?.parent ?? DEFAULTS.tracing.parent;
  const maxLinks = (given || undefined)?.maxLinks ?? DEFAULTS.tracing.maxLinks;
  if (given !== undefined && given !== false && (typeof given !== 'object' || given === null)) {
    problems.push('tracing must be false or an object');
  }
  if (parent !== 'link' && parent !== 'child') {
    problems.push(`tracing.parent must be 'link' or 'child', got ${JSON.stringify(parent)}`);
  }
  checkInteger(problems, 'tracing.maxLinks', maxLinks, 0);
  return { enabled: given !== false, parent, maxLinks };
}

export function resolveConsumerId(
  problems: string[],
  given: SequenceModuleOptions['consumerId'],
): string {
  if (given !== undefined && (typeof given !== 'string' || !SEQUENCE_ID_PATTERN.test(given))) {
    problems.push(
      'consumerId must be 1-128 characters of [A-Za-z0-9._:-]' + notAStringSuffix(given),
    );
  }
  return given ?? `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
}

/**
 * `, got the number 4242` for a value that is not a string, else nothing: RegExp.test turns what
 * it is given into a string, so a pattern alone would take a number (a pid) for its digits.
 */
export function notAStringSuffix(value: unknown): string {
  if (typeof value === 'string') return '';
  return typeof value === 'number' || typeof value === 'boolean'
    ? `, got the ${typeof value} ${String(value)}`
    : `, got ${kindOf(value)}`;
}
