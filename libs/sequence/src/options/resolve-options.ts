import { checkDelay, checkPrefetch } from '../core/option-checks';
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
  if (maxPublishTimeoutMs !== undefined && publish.confirmTimeoutMs > maxPublishTimeoutMs) {
    problems.push(
      `publish.confirmTimeoutMs (${publish.confirmTimeoutMs}) must be at most ` +
        `${maxPublishTimeoutMs} on the ${transport.name} transport: a publish retried for longer ` +
        'could be stored twice, so every one would be refused',
    );
  }
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
    transport,
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
      maxInlineBytes: transport.maxMessageBytes - tuning.headerAllowanceBytes,
      publish,
    }),
    resequencer: resolveResequencerOptions(problems, options.resequencer),
    outbox: resolveOutboxOptions(problems, options.outbox),
  };
}
