import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { partitionsProblem } from '../core/partition';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import {
  checkFunction,
  checkInteger,
  checkOneOf,
  checkOptionalChannel,
  checkPrefetch,
} from '../core/option-checks';
import type { ExpiryPolicy, SequenceLimits } from '../ports/sequence-store.port';
import type { Transport } from '../ports/transport.port';
import { DEFAULTS } from './defaults';
import { checkKeys, CONSUMER_RENAMES, SEQUENCE_CONSUMER_KEYS } from './option-keys';
import type { RetryPolicy } from './module-options';
import type {
  ResolvedOptions,
  ResolvedRetryPolicy,
  ResolvedSequenceConsumer,
  ResolvedSequenceOptions,
  ResolvedTuning,
} from './resolved-options';
import { resolveHandlerTimeout, resolveRetryPolicy } from './resolve-shared';
import type {
  MessageSequenceOptions,
  SequenceConsumerOptions,
  SequenceLimitOptions,
} from './sequence.options';

const STRATEGIES = ['fixed', 'sliding'] as const;
const BUFFER_MODES = ['store', 'broker'] as const;

/** `sequence.spool.dir` when none is given: in the temporary directory, which other users share. */
export const DEFAULT_SPOOL_DIR = join(tmpdir(), 'nest-sequence-spool');

/** The module's `sequence` options over the defaults; problems are added to `problems`. */
export function resolveSequenceOptions(
  problems: string[],
  given: MessageSequenceOptions | undefined,
  context: {
    transport: Pick<Transport, 'name' | 'maxMessageBytes'>;
    /** Its `maxMessageBytes` was refused: no default derived from it is checked. */
    transportRefused?: boolean;
    tuning: ResolvedTuning;
    handlerRetry: ResolvedRetryPolicy;
    handlerTimeoutMs: number | undefined;
    prefetch: number;
  },
): ResolvedSequenceOptions {
  const options = given ?? {};
  const { transport, tuning } = context;
  const allowance = tuning.headerAllowanceBytes;
  const fragmentBytes = options.fragmentBytes ?? transport.maxMessageBytes - allowance;
  if (checkInteger(problems, 'sequence.fragmentBytes', fragmentBytes, 1)) {
    if (fragmentBytes + allowance > transport.maxMessageBytes) {
      problems.push(
        `sequence.fragmentBytes (${fragmentBytes}) plus tuning.headerAllowanceBytes (${allowance}) ` +
          `exceeds the ${transport.name} transport's maxMessageBytes (${transport.maxMessageBytes}); ` +
          `set sequence.fragmentBytes to at most ${transport.maxMessageBytes - allowance}`,
      );
    }
  }
  const consumer = resolveConsumerInto(problems, 'sequence.', options, {
    timeout: { ms: DEFAULTS.sequence.timeoutMs, strategy: DEFAULTS.sequence.timeoutStrategy },
    maxSequenceBytes: DEFAULTS.sequence.maxSequenceBytes,
    maxFragments: DEFAULTS.sequence.maxFragments,
    maxFragmentBytes: transport.maxMessageBytes,
    maxHeaderBytes: DEFAULTS.sequence.maxHeaderBytes,
    handlerRetry: context.handlerRetry,
    handlerTimeoutMs: context.handlerTimeoutMs,
    prefetch: context.prefetch,
    prefetchBytes: DEFAULTS.sequence.prefetchBytes,
    buffer: DEFAULTS.sequence.buffer,
    partitions: DEFAULTS.sequence.partitions,
    window: DEFAULTS.sequence.window,
  });
  const maxBufferedBytes = options.maxBufferedBytes ?? DEFAULTS.sequence.maxBufferedBytes;
  const resolved: ResolvedSequenceOptions = {
    fragmentBytes,
    maxBufferedBytes,
    maxChannelBufferedBytes:
      options.maxChannelBufferedBytes ??
      defaultChannelBudget(maxBufferedBytes, consumer.maxSequenceBytes),
    maxOpenSequences: options.maxOpenSequences ?? DEFAULTS.sequence.maxOpenSequences,
    retentionMs: options.retentionMs ?? DEFAULTS.sequence.retentionMs,
    onExpired: options.onExpired,
    consumer,
    spool: {
      dir: options.spool?.dir ?? DEFAULT_SPOOL_DIR,
      maxBytes: options.spool?.maxBytes ?? DEFAULTS.sequence.spoolMaxBytes,
    },
  };
  checkInteger(problems, 'sequence.spool.maxBytes', resolved.spool.maxBytes, 1);
  if (typeof resolved.spool.dir !== 'string' || resolved.spool.dir.length === 0) {
    problems.push('sequence.spool.dir must be a non-empty path');
  }
  checkInteger(problems, 'sequence.maxBufferedBytes', resolved.maxBufferedBytes, 1);
  if (
    checkInteger(
      problems,
      'sequence.maxChannelBufferedBytes',
      resolved.maxChannelBufferedBytes,
      1,
    ) &&
    resolved.maxChannelBufferedBytes > resolved.maxBufferedBytes
  ) {
    problems.push(
      `sequence.maxChannelBufferedBytes (${resolved.maxChannelBufferedBytes}) exceeds ` +
        `sequence.maxBufferedBytes (${resolved.maxBufferedBytes}); use at most that`,
    );
  }
  checkInteger(problems, 'sequence.maxOpenSequences', resolved.maxOpenSequences, 1);
  checkInteger(problems, 'sequence.retentionMs', resolved.retentionMs, 1);
  checkFunction(problems, 'sequence.onExpired', options.onExpired);
  const derived = options.fragmentBytes === undefined && context.transportRefused === true;
  if (
    !derived &&
    Number.isSafeInteger(fragmentBytes) &&
    consumer.maxFragmentBytes < fragmentBytes
  ) {
    problems.push(
      `sequence.maxFragmentBytes (${consumer.maxFragmentBytes}) is below sequence.fragmentBytes ` +
        `(${fragmentBytes}): this module's consumers would dead-letter what its splitter sends; ` +
        'raise maxFragmentBytes or lower fragmentBytes',
    );
  }
  if (
    options.maxChannelBufferedBytes !== undefined &&
    consumer.maxSequenceBytes > options.maxChannelBufferedBytes
  ) {
    problems.push(
      `sequence.maxSequenceBytes (${consumer.maxSequenceBytes}) exceeds ` +
        `sequence.maxChannelBufferedBytes (${options.maxChannelBufferedBytes}): such a sequence ` +
        'could never be buffered whole; raise maxChannelBufferedBytes or lower maxSequenceBytes',
    );
  }
  if (consumer.maxSequenceBytes > resolved.maxBufferedBytes) {
    problems.push(
      `sequence.maxSequenceBytes (${consumer.maxSequenceBytes}) exceeds sequence.maxBufferedBytes ` +
        `(${resolved.maxBufferedBytes}): such a sequence could never be buffered whole; ` +
        'raise maxBufferedBytes or lower maxSequenceBytes',
    );
  }
  return resolved;
}

/**
 * A handler's sequence options over the module's; throws {@link SequenceOptionsError} naming
 * `where` (the decorated method, or the caller).
 */
export function resolveSequenceConsumer(
  where: string,
  overrides: SequenceConsumerOptions,
  options: Pick<ResolvedOptions, 'sequence'>,
): ResolvedSequenceConsumer {
  const problems: string[] = [];
  checkKeys(problems, overrides, SEQUENCE_CONSUMER_KEYS, CONSUMER_RENAMES);
  const resolved = resolveConsumerInto(problems, '', overrides, options.sequence.consumer);
  if (resolved.maxSequenceBytes > options.sequence.maxBufferedBytes) {
    problems.push(
      `maxSequenceBytes (${resolved.maxSequenceBytes}) exceeds the module's ` +
        `sequence.maxBufferedBytes (${options.sequence.maxBufferedBytes}); raise ` +
        'maxBufferedBytes or lower maxSequenceBytes',
    );
  }
  if (problems.length > 0) throw new SequenceOptionsError(where, problems);
  return resolved;
}

function resolveConsumerInto(
  problems: string[],
  at: string,
  options: SequenceLimitOptions & {
    handlerRetry?: RetryPolicy;
    handlerTimeoutMs?: number | false;
    prefetch?: number;
    prefetchBytes?: number;
    deadLetterChannel?: string;
    buffer?: 'store' | 'broker';
    partitions?: number;
    window?: number;
  },
  base: ResolvedSequenceConsumer,
): ResolvedSequenceConsumer {
  const timeout: ExpiryPolicy = {
    ms: options.timeoutMs ?? base.timeout.ms,
    strategy: options.timeoutStrategy ?? base.timeout.strategy,
  };
  checkInteger(problems, `${at}timeoutMs`, timeout.ms, 1);
  checkOneOf(problems, `${at}timeoutStrategy`, timeout.strategy, STRATEGIES);
  const resolved: ResolvedSequenceConsumer = {
    timeout,
    maxSequenceBytes: options.maxSequenceBytes ?? base.maxSequenceBytes,
    maxFragments: options.maxFragments ?? base.maxFragments,
    maxFragmentBytes: options.maxFragmentBytes ?? base.maxFragmentBytes,
    maxHeaderBytes: options.maxHeaderBytes ?? base.maxHeaderBytes,
    handlerRetry: resolveRetryPolicy(
      problems,
      `${at}handlerRetry`,
      options.handlerRetry,
      base.handlerRetry,
    ),
    handlerTimeoutMs: resolveHandlerTimeout(
      problems,
      `${at}handlerTimeoutMs`,
      options.handlerTimeoutMs,
      base.handlerTimeoutMs,
    ),
    prefetch: options.prefetch ?? base.prefetch,
    prefetchBytes: options.prefetchBytes ?? base.prefetchBytes,
    deadLetterChannel: options.deadLetterChannel ?? base.deadLetterChannel,
    buffer: options.buffer ?? base.buffer,
    partitions: options.partitions ?? base.partitions,
    window: options.window ?? base.window,
  };
  checkOneOf(problems, `${at}buffer`, resolved.buffer, BUFFER_MODES);
  const partitions = partitionsProblem(resolved.partitions);
  if (partitions) problems.push(`${at}${partitions}`);
  checkPrefetch(problems, `${at}window`, resolved.window);
  checkInteger(problems, `${at}maxSequenceBytes`, resolved.maxSequenceBytes, 1);
  checkInteger(problems, `${at}maxFragments`, resolved.maxFragments, 1);
  checkInteger(problems, `${at}maxFragmentBytes`, resolved.maxFragmentBytes, 1);
  checkInteger(problems, `${at}maxHeaderBytes`, resolved.maxHeaderBytes, 2);
  // The module's own prefetch is checked where it is given.
  if (options.prefetch !== undefined) checkPrefetch(problems, `${at}prefetch`, resolved.prefetch);
  checkInteger(problems, `${at}prefetchBytes`, resolved.prefetchBytes, 1);
  checkOptionalChannel(problems, `${at}deadLetterChannel`, resolved.deadLetterChannel);
  return resolved;
}

/**
 * The prefetch of a sequence consumer: `prefetch`, lowered so that as many fragments of
 * `maxFragmentBytes` fit in `prefetchBytes` (at least 1).
 */
export function fragmentPrefetch(
  consumer: Pick<ResolvedSequenceConsumer, 'prefetch' | 'prefetchBytes' | 'maxFragmentBytes'>,
): number {
  const fitting = Math.floor(consumer.prefetchBytes / consumer.maxFragmentBytes);
  return Math.max(1, Math.min(consumer.prefetch, fitting));
}

/**
 * `sequence.maxChannelBufferedBytes` when unset: three quarters of `maxBufferedBytes`, so that one
 * channel always leaves a quarter to the others; or, if more, room for one sequence of
 * `maxSequenceBytes` with its overheads (fragments of 64 KiB or more, headers up to 64 KiB); never
 * more than `maxBufferedBytes`.
 */
export function defaultChannelBudget(maxBufferedBytes: number, maxSequenceBytes: number): number {
  const oneSequence = maxSequenceBytes + Math.ceil(maxSequenceBytes / 512) + 64 * 1024;
  return Math.min(maxBufferedBytes, Math.max(Math.floor(maxBufferedBytes * 0.75), oneSequence));
}

/** The store-wide and per-handler limits, as the sequence store port takes them. */
export function sequenceLimits(
  consumer: ResolvedSequenceConsumer,
  sequence: ResolvedSequenceOptions,
): SequenceLimits {
  return {
    maxSequenceBytes: consumer.maxSequenceBytes,
    maxFragments: consumer.maxFragments,
    maxBufferedBytes: sequence.maxBufferedBytes,
    maxChannelBufferedBytes: sequence.maxChannelBufferedBytes,
    maxOpenSequences: sequence.maxOpenSequences,
  };
}
