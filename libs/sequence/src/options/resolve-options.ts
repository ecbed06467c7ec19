import { checkDelay, checkPrefetch } from '../core/option-checks';
import { kindOf } from '../core/option-keys';
import type { Transport } from '../ports/transport.port';
import { DEFAULTS } from './defaults';
import { checkKeys, MODULE_KEYS, MODULE_RENAMES, withoutNullOptions } from './option-keys';
import type { SequenceModuleOptions } from './module-options';
import type { ResolvedOptions } from './resolved-options';
import { resolveClaimCheckOptions } from './resolve-claim-check';
import { resolveOutboxOptions } from './resolve-outbox';
import { resolveResequencerOptions } from './resolve-resequencer';
import { resolveSequenceOptions } from './resolve-sequence';
import {
  resolveConsumerId,
  resolveHandlerTimeout,
  resolveMetrics,
  resolvePublishPolicy,
  resolveRetryPolicy,
  resolveTracing,
  resolveTuning,
} from './resolve-shared';

/**
 * Applies the defaults to the module's options and checks them all, against the transport the
 * module runs on. Every problem found is added to `problems` (the caller throws one
 * SequenceOptionsError listing them, with the adapters' problems); the result is only meant to
 * be used when there is none.
 */
export function resolveModuleOptions(
  problems: string[],
  given: SequenceModuleOptions,
  transport: Transport,
): ResolvedOptions {
  checkKeys(problems, given, MODULE_KEYS, MODULE_RENAMES);
  // Null options were refused just now: resolved as left out, each is listed once.
  const options = withoutNullOptions(given, MODULE_KEYS);
  const tuning = resolveTuning(problems, options.tuning);
  const publish = resolvePublishPolicy(problems, 'publish', options.publish, DEFAULTS.publish);
  const { maxPublishTimeoutMs } = transport;
  const timeoutProblem = positiveIntegerProblem(transport, 'maxPublishTimeoutMs');
  if (maxPublishTimeoutMs !== undefined && timeoutProblem) {
    problems.push(timeoutProblem);
  } else if (maxPublishTimeoutMs !== undefined && publish.confirmTimeoutMs > maxPublishTimeoutMs) {
    problems.push(
      `publish.confirmTimeoutMs (${publish.confirmTimeoutMs}) must be at most ` +
        `${maxPublishTimeoutMs} on the ${transport.name} transport: a publish retried for longer ` +
        'could be stored twice, so every one would be refused',
    );
  }
  const sizeProblem = messageBytesProblem(transport, tuning.headerAllowanceBytes);
  if (sizeProblem) problems.push(sizeProblem);
  // Refused, the transport's size is left out of the other checks (a limit none reaches stands
  // in): their problems would only restate this one, and the result is not used.
  const sized = {
    name: transport.name,
    maxMessageBytes: sizeProblem ? Number.MAX_SAFE_INTEGER : transport.maxMessageBytes,
  };
  const handlerRetry = resolveRetryPolicy(
    problems,
    'handlerRetry',
    options.handlerRetry,
    DEFAULTS.handlerRetry,
  );
  const handlerTimeoutMs = resolveHandlerTimeout(
    problems,
    'handlerTimeoutMs',
    options.handlerTimeoutMs,
    DEFAULTS.handlerTimeoutMs,
  );
  const prefetch = options.prefetch ?? DEFAULTS.prefetch;
  checkPrefetch(problems, 'prefetch', prefetch);
  const shutdownTimeoutMs = options.shutdownTimeoutMs ?? DEFAULTS.shutdownTimeoutMs;
  checkDelay(problems, 'shutdownTimeoutMs', shutdownTimeoutMs, 0);
  const sequence = resolveSequenceOptions(problems, options.sequence, {
    transport: sized,
    transportRefused: sizeProblem !== undefined,
    tuning,
    handlerRetry,
    handlerTimeoutMs,
    prefetch,
  });
  return {
    consumerId: resolveConsumerId(problems, options.consumerId),
    publish,
    handlerRetry,
    handlerTimeoutMs,
    prefetch,
    shutdownTimeoutMs,
    metrics: resolveMetrics(problems, options.metrics),
    tracing: resolveTracing(problems, options.tracing),
    tuning,
    sequence,
    claimCheck: resolveClaimCheckOptions(problems, options.claimCheck, {
      maxInlineBytes: sized.maxMessageBytes - tuning.headerAllowanceBytes,
      publish,
    }),
    resequencer: resolveResequencerOptions(problems, options.resequencer),
    outbox: resolveOutboxOptions(problems, options.outbox),
  };
}

/**
 * Why the transport's `maxMessageBytes` cannot be used, if it cannot: it must be a positive safe
 * integer, above `tuning.headerAllowanceBytes` (the room kept for a fragment's headers) so that a
 * fragment carries at least one byte of body. Otherwise every size derived from it is meaningless
 * (NaN compares false, so nothing would ever be refused as too large).
 */
function messageBytesProblem(transport: Transport, allowance: number): string | undefined {
  const { maxMessageBytes } = transport;
  const at = `the ${transport.name} transport's maxMessageBytes`;
  const notCount = positiveIntegerProblem(transport, 'maxMessageBytes');
  if (notCount) return notCount;
  // An allowance that is no count was refused with the tuning.
  if (Number.isSafeInteger(allowance) && allowance >= 0 && maxMessageBytes <= allowance) {
    return (
      `${at} (${maxMessageBytes}) must be above tuning.headerAllowanceBytes (${allowance}), ` +
      "the room kept for a fragment's headers"
    );
  }
  return undefined;
}

/** Why the transport's `field` is no positive safe integer, if it is not. */
function positiveIntegerProblem(
  transport: Transport,
  field: 'maxMessageBytes' | 'maxPublishTimeoutMs',
): string | undefined {
  const value: unknown = transport[field];
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 1) return undefined;
  const got = typeof value === 'number' ? String(value) : kindOf(value);
  return `the ${transport.name} transport's ${field} must be a positive integer, got ${got}`;
}
