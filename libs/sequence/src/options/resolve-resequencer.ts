import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { ResequenceHeader } from '../core/resequence-input';
import {
  checkFunction,
  checkInteger,
  checkOneOf,
  checkOptionalChannel,
  checkPrefetch,
  deadLetterLoopProblem,
} from '../core/option-checks';
import { isSequenceNumber, MAX_SEQUENCE_NUMBER } from '../ports/resequencer-store.port';
import { DEFAULTS } from './defaults';
import { checkKeys, RESEQUENCER_DEFINITION_KEYS, withoutNullOptions } from './option-keys';
import type {
  ResolvedOptions,
  ResolvedResequencer,
  ResolvedResequencerOptions,
} from './resolved-options';
import type {
  OverflowPolicy,
  ResequencerDefinition,
  ResequencerOptions,
} from './resequencer.options';
import { resolveHandlerTimeout, resolveRetryPolicy } from './resolve-shared';
import type { GapPolicy } from '../ports/resequencer-store.port';

/** Most `outputInFlight`: past the broker's usual confirm batches, more gains nothing. */
export const MAX_OUTPUT_IN_FLIGHT = 256;

const POLICIES: readonly GapPolicy[] = ['alert', 'skip', 'dead-letter'];
const OVERFLOWS: readonly OverflowPolicy[] = ['backpressure', 'dead-letter'];

/** The module's `resequencer` options over the defaults; problems are added to `problems`. */
export function resolveResequencerOptions(
  problems: string[],
  given: ResequencerOptions | undefined,
): ResolvedResequencerOptions {
  const options = given ?? {};
  const defaults = DEFAULTS.resequencer;
  const resolved: ResolvedResequencerOptions = {
    maxBufferedPerKey: options.maxBufferedPerKey ?? defaults.maxBufferedPerKey,
    maxBufferedTotal: options.maxBufferedTotal ?? defaults.maxBufferedTotal,
    maxBufferedBytesPerKey: options.maxBufferedBytesPerKey ?? defaults.maxBufferedBytesPerKey,
    maxBufferedBytesTotal: options.maxBufferedBytesTotal ?? defaults.maxBufferedBytesTotal,
    maxSeqAhead: options.maxSeqAhead,
    overflow: options.overflow ?? defaults.overflow,
    onGap: options.onGap,
  };
  checkInteger(problems, 'resequencer.maxBufferedPerKey', resolved.maxBufferedPerKey, 1);
  checkInteger(problems, 'resequencer.maxBufferedTotal', resolved.maxBufferedTotal, 1);
  checkInteger(problems, 'resequencer.maxBufferedBytesPerKey', resolved.maxBufferedBytesPerKey, 1);
  checkInteger(problems, 'resequencer.maxBufferedBytesTotal', resolved.maxBufferedBytesTotal, 1);
  if (options.maxSeqAhead !== undefined) {
    checkInteger(problems, 'resequencer.maxSeqAhead', options.maxSeqAhead, 1);
  }
  checkOneOf(problems, 'resequencer.overflow', resolved.overflow, OVERFLOWS);
  checkFunction(problems, 'resequencer.onGap', options.onGap);
  return resolved;
}

/** Problems of one resequencer definition on its own (empty when it is valid). */
export function definitionProblems(given: ResequencerDefinition): string[] {
  const problems: string[] = [];
  checkKeys(problems, given, RESEQUENCER_DEFINITION_KEYS);
  // Null options were refused just now: checked as left out, each is listed once.
  const definition = withoutNullOptions(given, RESEQUENCER_DEFINITION_KEYS);
  const { channel, name, key, seq, output, callHandler, start, gap } = definition;
  if (typeof channel !== 'string' || channel.length === 0) {
    problems.push('channel must be a non-empty string: the queue the events arrive on');
  }
  if (name !== undefined && (typeof name !== 'string' || name.length === 0)) {
    problems.push('name must be a non-empty string');
  }
  for (const [field, value] of [
    ['key', key],
    ['seq', seq],
  ] as const) {
    if (value === undefined || typeof value === 'function') continue;
    if (typeof value !== 'string' || value.length === 0) {
      problems.push(`${field} must be a header name or a function of the message`);
    }
  }
  if (output !== undefined && (typeof output !== 'string' || output.length === 0)) {
    problems.push('output must be a non-empty channel name');
  }
  if (output !== undefined && output === channel) {
    problems.push('output must differ from channel: released events would be resequenced again');
  }
  if (definition.outputInFlight !== undefined) {
    const valid = checkInteger(problems, 'outputInFlight', definition.outputInFlight, 1);
    if (valid && definition.outputInFlight > MAX_OUTPUT_IN_FLIGHT) {
      problems.push(
        `outputInFlight must be at most ${MAX_OUTPUT_IN_FLIGHT}, got ${definition.outputInFlight}`,
      );
    }
    if (valid && definition.outputInFlight > 1 && (output === undefined || callHandler === true)) {
      problems.push(
        'outputInFlight above 1 needs an output channel and no handler call (callHandler: false): ' +
          'a handler takes each event after the previous one',
      );
    }
  }
  // A string from a config file ('false') would otherwise call the handler as true does.
  if (callHandler !== undefined) checkOneOf(problems, 'callHandler', callHandler, [true, false]);
  if (callHandler === false && output === undefined) {
    problems.push('callHandler: false needs an output channel, or released events go nowhere');
  }
  if (start !== undefined && !isSequenceNumber(start)) {
    problems.push(
      `start must be an integer >= 0 (at most ${MAX_SEQUENCE_NUMBER}), got ${String(start)}`,
    );
  }
  if (typeof gap !== 'object' || gap === null) {
    problems.push("gap is required: { timeoutMs, policy: 'alert' | 'skip' | 'dead-letter' }");
  } else {
    checkInteger(problems, 'gap.timeoutMs', gap.timeoutMs, 1);
    checkOneOf(problems, 'gap.policy', gap.policy, POLICIES);
  }
  if (definition.maxBufferedPerKey !== undefined) {
    checkInteger(problems, 'maxBufferedPerKey', definition.maxBufferedPerKey, 1);
  }
  if (definition.maxBufferedBytesPerKey !== undefined) {
    checkInteger(problems, 'maxBufferedBytesPerKey', definition.maxBufferedBytesPerKey, 1);
  }
  if (definition.maxSeqAhead !== undefined) {
    checkInteger(problems, 'maxSeqAhead', definition.maxSeqAhead, 1);
  }
  if (definition.overflow !== undefined) {
    checkOneOf(problems, 'overflow', definition.overflow, OVERFLOWS);
  }
  return problems;
}

/**
 * Validates `definition` and applies the module's defaults; throws {@link SequenceOptionsError}
 * naming `where` (the decorated method, or `ResequencerService.create`).
 */
export function resolveResequencerDefinition(
  where: string,
  given: ResequencerDefinition,
  options: Pick<
    ResolvedOptions,
    'resequencer' | 'handlerRetry' | 'handlerTimeoutMs' | 'prefetch' | 'publish' | 'tuning'
  >,
  deadLetterChannelOf: (channel: string) => string,
): ResolvedResequencer {
  const problems = definitionProblems(given);
  const definition = withoutNullOptions(given, RESEQUENCER_DEFINITION_KEYS);
  const { leaseMs, drain } = options.tuning;
  // A drainer renews its lease every third of leaseMs and stops a fifth before it could lapse,
  // which leaves 7/15 of leaseMs between a renewal due and that point; each publish attempt (up
  // to confirmTimeoutMs) must fit in it with room for the renewal's own round trip (a fifteenth
  // of leaseMs), or it could confirm an event after the next holder has delivered later ones (it
  // is never started: see DrainLease).
  const confirmCeiling = Math.floor((leaseMs * 2) / 5);
  if (options.publish.confirmTimeoutMs > confirmCeiling) {
    problems.push(
      `publish.confirmTimeoutMs (${options.publish.confirmTimeoutMs}) must be at most 2/5 of ` +
        `tuning.leaseMs (${leaseMs}), that is ${confirmCeiling} ms: a drainer must be able to ` +
        'finish a publish attempt before its drain lease could pass to another instance',
    );
  }
  const handlerRetry = resolveRetryPolicy(
    problems,
    'handlerRetry',
    definition.handlerRetry,
    options.handlerRetry,
  );
  const handlerTimeoutMs = resolveHandlerTimeout(
    problems,
    'handlerTimeoutMs',
    definition.handlerTimeoutMs,
    options.handlerTimeoutMs,
  );
  const prefetch = definition.prefetch ?? options.prefetch;
  checkPrefetch(problems, 'prefetch', prefetch);
  checkOptionalChannel(problems, 'deadLetterChannel', definition.deadLetterChannel);
  const loop = deadLetterLoopProblem(
    'deadLetterChannel',
    definition.deadLetterChannel,
    definition.channel,
  );
  if (loop) problems.push(loop);
  const inFlight = definition.outputInFlight;
  if (Number.isSafeInteger(inFlight) && (inFlight as number) > drain.batchSize) {
    problems.push(
      `outputInFlight (${inFlight}) must be at most the module's tuning.drain.batchSize ` +
        `(${drain.batchSize}): a window never spans more than one claimed batch; raise ` +
        'tuning.drain.batchSize or lower outputInFlight',
    );
  }
  if (problems.length > 0) throw new SequenceOptionsError(where, problems);
  return {
    name: definition.name ?? definition.channel,
    channel: definition.channel,
    key: definition.key ?? ResequenceHeader.key,
    seq: definition.seq ?? ResequenceHeader.seq,
    output: definition.output,
    outputInFlight: definition.outputInFlight ?? DEFAULTS.resequencer.outputInFlight,
    callHandler: definition.callHandler ?? definition.output === undefined,
    start: definition.start ?? DEFAULTS.resequencer.start,
    gap: { timeoutMs: definition.gap.timeoutMs, policy: definition.gap.policy },
    maxBufferedPerKey: definition.maxBufferedPerKey ?? options.resequencer.maxBufferedPerKey,
    maxBufferedBytesPerKey:
      definition.maxBufferedBytesPerKey ?? options.resequencer.maxBufferedBytesPerKey,
    maxBufferedBytesTotal: options.resequencer.maxBufferedBytesTotal,
    maxSeqAhead: definition.maxSeqAhead ?? options.resequencer.maxSeqAhead,
    overflow: definition.overflow ?? options.resequencer.overflow,
    handlerRetry,
    handlerTimeoutMs,
    prefetch,
    deadLetterChannel: definition.deadLetterChannel ?? deadLetterChannelOf(definition.channel),
  };
}
