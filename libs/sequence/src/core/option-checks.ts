import { MAX_TIMER_MS } from './async';

/**
 * Checks of option values, shared by the module's options and the adapters' own. Each adds a
 * problem (what is wrong, and what to use instead) to `problems` and says whether the value was
 * fine, so that a caller lists every problem at once.
 */

/** Most unsettled messages one subscription may hold (RabbitMQ's limit on a prefetch count). */
export const MAX_PREFETCH = 65_535;

/** Adds a problem unless `value` is a safe integer >= `min`; says whether it was. */
export function checkInteger(
  problems: string[],
  name: string,
  value: unknown,
  min: number,
): boolean {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min) {
    const got = typeof value === 'string' ? `the string ${JSON.stringify(value)}` : String(value);
    const hint =
      typeof value === 'string' ? ' (convert values read from the environment with Number())' : '';
    problems.push(`${name} must be an integer >= ${min}, got ${got}${hint}`);
    return false;
  }
  return true;
}

/**
 * {@link checkInteger} for a duration a timer waits: also at most {@link MAX_TIMER_MS}, past
 * which Node fires the timer after 1 ms (a sweep or a renewal would spin).
 */
export function checkDelay(problems: string[], name: string, value: unknown, min: number): boolean {
  if (!checkInteger(problems, name, value, min)) return false;
  if ((value as number) > MAX_TIMER_MS) {
    problems.push(
      `${name} must be at most ${MAX_TIMER_MS} ms (the longest a timer waits), got ${String(value)}`,
    );
    return false;
  }
  return true;
}

/**
 * {@link checkInteger} for a subscription's `prefetch`: also at most {@link MAX_PREFETCH}
 * (RabbitMQ's limit, which a subscription on the broker would fail at bootstrap).
 */
export function checkPrefetch(problems: string[], name: string, value: unknown): boolean {
  if (!checkInteger(problems, name, value, 1)) return false;
  if ((value as number) > MAX_PREFETCH) {
    problems.push(`${name} must be at most ${MAX_PREFETCH}, got ${String(value)}`);
    return false;
  }
  return true;
}

/** {@link checkDelay} for an interval that `false` turns off. */
export function checkInterval(
  problems: string[],
  name: string,
  value: unknown,
  min: number,
): boolean {
  if (value === false) return true;
  if (value === 0) {
    problems.push(`${name} must be above 0 (or false to turn it off on this instance)`);
    return false;
  }
  return checkDelay(problems, name, value, min);
}

/** Adds a problem unless `value` is undefined or a channel name: a string that is not empty. */
export function checkOptionalChannel(problems: string[], name: string, value: unknown): boolean {
  if (value === undefined || (typeof value === 'string' && value.length > 0)) return true;
  problems.push(
    typeof value === 'string'
      ? `${name} must not be empty`
      : `${name} must be a channel name, got ${value === null ? 'null' : `a ${typeof value}`}`,
  );
  return false;
}

/**
 * The problem with a handler that consumes `consumed` dead-lettering into it, or undefined: each
 * message it refuses would be delivered to it again. `option` names the setting that chose the
 * dead-letter channel (`deadLetterChannel`, or the module's option the handler inherits).
 */
export function deadLetterLoopProblem(
  option: string,
  deadLetterChannel: string | undefined,
  consumed: string,
): string | undefined {
  if (deadLetterChannel !== consumed) return undefined;
  return (
    `${option} is ${consumed}, the channel this handler consumes: each message it refuses would ` +
    'come back to it and be refused again, without end; name another channel, or leave ' +
    "deadLetterChannel out for the transport's own dead-letter channel of " +
    consumed
  );
}

/** Adds a problem unless `value` is undefined or a function. */
export function checkFunction(problems: string[], name: string, value: unknown): boolean {
  if (value === undefined || typeof value === 'function') return true;
  problems.push(`${name} must be a function`);
  return false;
}

/** Adds a problem unless `value` is one of `allowed`. */
export function checkOneOf<T extends string | boolean>(
  problems: string[],
  name: string,
  value: unknown,
  allowed: readonly T[],
): value is T {
  if (allowed.includes(value as T)) return true;
  const list = allowed.map((each) => (typeof each === 'string' ? `'${each}'` : String(each)));
  const last = list.pop()!;
  problems.push(
    `${name} must be ${list.length > 0 ? `${list.join(', ')} or ${last}` : last}, got ` +
      // Quoted when text: the string 'true' is not the boolean.
      (typeof value === 'string' ? JSON.stringify(value) : String(value)),
  );
  return false;
}
