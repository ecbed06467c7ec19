import { randomBytes } from 'node:crypto';
import { STORE_NAME_PATTERN } from '../core/claim-ticket';
import { ClaimTicketKeyring } from '../core/claim-ticket-keyring';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { MAX_TIMER_MS } from '../core/async';
import { checkInteger } from '../core/option-checks';
import type { PayloadStore } from '../ports/payload-store.port';
import type { ClaimCheckConsumerOptions, ClaimCheckOptions } from './claim-check.options';
import { DEFAULTS } from './defaults';
import type {
  ResolvedClaimCheckConsumer,
  ResolvedClaimCheckOptions,
  ResolvedOptions,
  ResolvedPublishPolicy,
} from './resolved-options';
import { resolveSequenceConsumer } from './resolve-sequence';

/** The longest ticket life: its expiry (now + ttlMs) must stay an exact number of milliseconds. */
export const MAX_TTL_MS = 100 * 365 * 24 * 60 * 60 * 1000;

/** The module's `claimCheck` options over the defaults; problems are added to `problems`. */
export function resolveClaimCheckOptions(
  problems: string[],
  given: ClaimCheckOptions | undefined,
  context: {
    /** Largest payload a message of the transport carries inline (headers left room). */
    maxInlineBytes: number;
    publish: ResolvedPublishPolicy;
  },
): ResolvedClaimCheckOptions {
  const options = given ?? {};
  const defaults = DEFAULTS.claimCheck;
  const { maxInlineBytes } = context;
  // The default shrinks to fit a transport with small messages; a given one must fit.
  const inlineMaxBytes =
    options.inlineMaxBytes ?? Math.max(0, Math.min(defaults.inlineMaxBytes, maxInlineBytes));
  if (checkInteger(problems, 'claimCheck.inlineMaxBytes', inlineMaxBytes, 0)) {
    if (inlineMaxBytes > maxInlineBytes) {
      problems.push(
        `claimCheck.inlineMaxBytes (${inlineMaxBytes}) exceeds what one message of the ` +
          `transport carries (${maxInlineBytes} bytes besides headers); use at most ${maxInlineBytes}`,
      );
    }
  }
  const sequenceMaxBytes = options.sequenceMaxBytes ?? defaults.sequenceMaxBytes;
  checkInteger(problems, 'claimCheck.sequenceMaxBytes', sequenceMaxBytes, 0);
  const ttlMs = options.ttlMs ?? defaults.ttlMs;
  checkDuration(problems, 'claimCheck.ttlMs', ttlMs, 1);
  const expiredGraceMs = options.expiredGraceMs ?? defaults.expiredGraceMs;
  checkDuration(problems, 'claimCheck.expiredGraceMs', expiredGraceMs, 0);
  const orphanGraceMs = options.orphanGraceMs ?? defaults.orphanGraceMs;
  if (checkInteger(problems, 'claimCheck.orphanGraceMs', orphanGraceMs, 0)) {
    // A payload is an orphan-to-be from its store write until its ticket's publish is confirmed:
    // the sweeper must not take one whose ticket is still being published.
    const { confirmTimeoutMs, retry } = context.publish;
    const budgetMs = retry.attempts * (confirmTimeoutMs + retry.maxDelayMs);
    if (orphanGraceMs <= 2 * budgetMs) {
      problems.push(
        `claimCheck.orphanGraceMs (${orphanGraceMs}) must be above twice the longest a ticket's ` +
          'publish may take with its retries (publish.retry.attempts × (publish.confirmTimeoutMs ' +
          `+ publish.retry.maxDelayMs) = ${budgetMs} ms), that is above ${2 * budgetMs} ms`,
      );
    }
  }
  const deleteAfter = options.deleteAfter ?? defaults.deleteAfter;
  const retentionProblem = claimRetentionProblem(deleteAfter);
  if (retentionProblem) problems.push(`claimCheck.deleteAfter ${retentionProblem}`);
  const acceptTicketsWithoutAudience =
    options.acceptTicketsWithoutAudience ?? defaults.acceptTicketsWithoutAudience;
  if (typeof acceptTicketsWithoutAudience !== 'boolean') {
    problems.push(
      'claimCheck.acceptTicketsWithoutAudience must be true or false, got ' +
        JSON.stringify(acceptTicketsWithoutAudience),
    );
  }

  const readTimeoutMs = timerOption(problems, 'readTimeoutMs', options, defaults);
  const writeTimeoutMs = timerOption(problems, 'writeTimeoutMs', options, defaults);

  let keyring: ClaimTicketKeyring | undefined;
  try {
    keyring = new ClaimTicketKeyring(
      options.signingKeys ?? [
        { id: `ephemeral-${randomBytes(4).toString('hex')}`, secret: randomBytes(32) },
      ],
    );
  } catch (error) {
    if (!(error instanceof SequenceOptionsError)) throw error;
    problems.push(...error.problems.map((problem) => `claimCheck.signingKeys: ${problem}`));
  }
  return {
    // Only read once `problems` is empty, by when the keyring exists.
    keyring: keyring!,
    ephemeralKeys: options.signingKeys === undefined,
    inlineMaxBytes,
    maxInlineBytes,
    sequenceMaxBytes,
    ttlMs,
    orphanGraceMs,
    expiredGraceMs,
    deleteAfter,
    acceptTicketsWithoutAudience,
    readTimeoutMs,
    writeTimeoutMs,
  };
}

/** A duration option of `claimCheck` that a Node timer waits for: 1 ms up to a timer's longest. */
function timerOption(
  problems: string[],
  key: 'readTimeoutMs' | 'writeTimeoutMs',
  options: ClaimCheckOptions,
  defaults: Pick<ResolvedClaimCheckOptions, 'readTimeoutMs' | 'writeTimeoutMs'>,
): number {
  const ms = options[key] ?? defaults[key];
  if (checkInteger(problems, `claimCheck.${key}`, ms, 1) && ms > MAX_TIMER_MS) {
    problems.push(
      `claimCheck.${key} must be at most ${MAX_TIMER_MS} (a Node timer's longest), got ${ms}`,
    );
  }
  return ms;
}

/**
 * Problems with the payload stores tickets may name: each name must travel in a ticket, and
 * names must differ (a ticket names its store).
 */
export function payloadStoreProblems(stores: readonly PayloadStore[]): string[] {
  const problems: string[] = [];
  const seen = new Set<string>();
  for (const store of stores) {
    if (typeof store.name !== 'string' || !STORE_NAME_PATTERN.test(store.name)) {
      problems.push(
        `claimCheck: payload store name ${JSON.stringify(store.name)} cannot travel in a ` +
          'ticket; use 1-64 characters of [A-Za-z0-9._-], starting with a letter or digit',
      );
    } else if (seen.has(store.name)) {
      problems.push(
        `claimCheck: two payload stores are named ${JSON.stringify(store.name)}; tickets ` +
          'name their store, so names must differ',
      );
    }
    seen.add(store.name);
  }
  return problems;
}

/**
 * Problems with stores that drop expired payloads on their own (Redis keys expire): each must
 * keep a payload `expiredGraceMs` past its expiry, as long as a handler that took its ticket
 * just before then may read it.
 */
export function payloadStoreRetentionProblems(
  stores: Iterable<PayloadStore>,
  expiredGraceMs: number,
): string[] {
  const problems: string[] = [];
  for (const store of stores) {
    const keptMs = store.expiredRetentionMs;
    if (typeof keptMs !== 'number' || !(keptMs < expiredGraceMs)) continue;
    problems.push(
      `claimCheck.expiredGraceMs (${expiredGraceMs}) is longer than the ` +
        `${JSON.stringify(store.name)} payload store keeps an expired payload (${keptMs} ms ` +
        'after its expiry): a handler that took a ticket just before its expiry could lose the ' +
        `payload mid-read; give the store a keyTtlMarginMs of at least ${expiredGraceMs}, or ` +
        'lower claimCheck.expiredGraceMs',
    );
  }
  return problems;
}

/**
 * A `@ClaimCheck` handler's options over the module's; throws {@link SequenceOptionsError}
 * naming `where`.
 */
export function resolveClaimCheckConsumer(
  where: string,
  given: ClaimCheckConsumerOptions,
  options: Pick<ResolvedOptions, 'sequence' | 'claimCheck'>,
): ResolvedClaimCheckConsumer {
  const { deleteAfter, handlerRetry, handlerTimeoutMs, prefetch, deadLetterChannel, sequence } =
    given;
  const retentionProblem =
    deleteAfter === undefined ? undefined : claimRetentionProblem(deleteAfter);
  if (retentionProblem) throw new SequenceOptionsError(where, [`deleteAfter ${retentionProblem}`]);
  // The sequence options reach the aggregator unchanged: resolved (and checked) as one.
  const resolved = resolveSequenceConsumer(
    where,
    { ...sequence, handlerRetry, handlerTimeoutMs, prefetch, deadLetterChannel },
    options,
  );
  return {
    deleteAfter: deleteAfter ?? options.claimCheck.deleteAfter,
    handlerRetry: resolved.handlerRetry,
    handlerTimeoutMs: resolved.handlerTimeoutMs,
    prefetch: resolved.prefetch,
    // The handler's own, else the transport's `<channel>.dlq`: not the module's
    // sequence.deadLetterChannel, which is Message Sequence's (the receiver gives the sequences
    // that reach this channel the same place).
    deadLetterChannel,
    sequence: resolved,
  };
}

/** What is wrong with a retention setting, or undefined. */
export function claimRetentionProblem(retention: unknown): string | undefined {
  if (retention === 'ack' || retention === 'ttl') return undefined;
  if (typeof retention === 'object' && retention !== null) {
    const consumers = (retention as { consumers?: unknown }).consumers;
    if (typeof consumers === 'number' && Number.isSafeInteger(consumers) && consumers >= 1) {
      return undefined;
    }
  }
  return `must be 'ack', 'ttl' or { consumers: N } with N ≥ 1, got ${JSON.stringify(retention)}`;
}

function checkDuration(problems: string[], name: string, value: number, min: number): void {
  if (checkInteger(problems, name, value, min) && value > MAX_TTL_MS) {
    problems.push(`${name} must be at most ${MAX_TTL_MS} (100 years), got ${value}`);
  }
}
