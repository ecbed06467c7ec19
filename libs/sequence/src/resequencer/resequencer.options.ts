import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { definedOnly } from '../core/objects';
import {
  isSequenceNumber,
  MAX_SEQUENCE_NUMBER,
  type GapPolicy,
  type ResequencerStore,
} from '../ports/resequencer-store.port';
import {
  checkDelay,
  checkInteger,
  checkPrefetch,
  type HandlerRetryOptions,
} from '../sequence.options';
import type { GapEvent } from './gap-event';
import { ResequenceHeader, type ResequencerInput } from './resequenced-event';

/** What happens to an event that would be buffered past a bound. */
export type OverflowPolicy = 'backpressure' | 'dead-letter';

/** Module-wide Resequencer options: `SequenceModule.forRoot({ resequencer })`. */
export interface ResequencerModuleOptions {
  /** Where keys' state lives; shared by every instance. @default a new memory store (one process) */
  store?: ResequencerStore;
  /** Most events buffered for one key. @default 1000 */
  maxBufferedPerKey?: number;
  /** Most events buffered per resequencer, all keys together. @default 100000 */
  maxBufferedTotal?: number;
  /** Over a bound: nack with requeue after `backpressureDelayMs`, or dead-letter. @default 'backpressure' */
  overflow?: OverflowPolicy;
  /** Hand-off items a drainer takes per store round trip. @default 32 */
  drainBatch?: number;
  /**
   * How long a consumer whose released event another instance is delivering waits for that
   * delivery before it requeues its message (to wait again later). @default 2000
   */
  drainWaitMs?: number;
  /** How often the gap sweeper runs; `false` disables it on this instance. @default 1000 */
  sweepIntervalMs?: number | false;
  /** Gaps (and stalled hand-offs) handled per resequencer per sweep. @default 100 */
  sweepBatch?: number;
  /** Called for every gap alert, skip and dead-lettered event, by the instance that delivered it. */
  onGap?: (event: GapEvent) => void | Promise<void>;
}

/** How a resequencer finds an event's key or sequence: a header name, or a function of the message. */
export type ResequencerField<T> = string | ((message: ResequencerInput) => T);

/** One resequencer: what `@Resequenced` takes, and `ResequencerService.create`. */
export interface ResequencerDefinition {
  /** The channel (queue) the events arrive on. */
  channel: string;
  /** The resequencer's name: keys of different names never share state. @default channel */
  name?: string;
  /** The event's key. @default the header `x-resequence-key` */
  key?: ResequencerField<string>;
  /** The event's sequence number. @default the header `x-resequence-seq` */
  seq?: ResequencerField<number>;
  /** Publish released events, in order and with confirms, to this channel. */
  output?: string;
  /**
   * Publishes to `output` of one key's released events awaiting their confirms at once. 1 sends
   * each event only once the previous one is confirmed: strict order whatever the broker does.
   * Above 1, a key's events leave in order without waiting for each confirm (faster); the order
   * then still holds unless the broker refuses an event and accepts a later one (a queue at its
   * length limit with `overflow: reject-publish`, a queue process failing): see
   * docs/resequencer.md. Only for `output` without the handler. @default 1
   */
  outputInFlight?: number;
  /** Call the handler with released events. @default true without `output`, false with it */
  callHandler?: boolean;
  /** Each key's first sequence number. @default 1 */
  start?: number;
  /** How long a gap may stay open, and what then. */
  gap: { timeoutMs: number; policy: GapPolicy };
  /** @default the module's `resequencer.maxBufferedPerKey` */
  maxBufferedPerKey?: number;
  /** @default the module's `resequencer.overflow` */
  overflow?: OverflowPolicy;
  /** Handler calls per event before the event is dead-lettered (the key then moves on). */
  handlerRetry?: HandlerRetryOptions;
  /** Unsettled input messages in this consumer's hands at once. @default 16 */
  prefetch?: number;
  /** Where refused events and gap records go. @default the transport's `<channel>.dlq` */
  deadLetterChannel?: string;
}

export interface ResolvedResequencerModuleOptions {
  readonly store?: ResequencerStore;
  readonly maxBufferedPerKey: number;
  readonly maxBufferedTotal: number;
  readonly overflow: OverflowPolicy;
  readonly drainBatch: number;
  readonly drainWaitMs: number;
  readonly sweepIntervalMs: number | false;
  readonly sweepBatch: number;
  readonly onGap?: (event: GapEvent) => void | Promise<void>;
}

export const RESEQUENCER_DEFAULTS = {
  maxBufferedPerKey: 1000,
  maxBufferedTotal: 100_000,
  overflow: 'backpressure',
  drainBatch: 32,
  drainWaitMs: 2000,
  sweepIntervalMs: 1000,
  sweepBatch: 100,
  start: 1,
} as const;

/** Most `outputInFlight`: past the broker's usual confirm batches, more gains nothing. */
export const MAX_OUTPUT_IN_FLIGHT = 256;

const POLICIES: ReadonlySet<unknown> = new Set<GapPolicy>(['alert', 'skip', 'dead-letter']);
const OVERFLOWS: ReadonlySet<unknown> = new Set<OverflowPolicy>(['backpressure', 'dead-letter']);

/** Applies defaults; throws {@link SequenceOptionsError} listing every problem. */
export function resolveResequencerModuleOptions(
  options: ResequencerModuleOptions = {},
): ResolvedResequencerModuleOptions {
  const problems: string[] = [];
  const resolved: ResolvedResequencerModuleOptions = {
    ...RESEQUENCER_DEFAULTS,
    ...definedOnly({ ...options }),
  };
  if (resolved.store !== undefined && typeof resolved.store.accept !== 'function') {
    problems.push('store must implement ResequencerStore (e.g. new RedisResequencerStore(redis))');
  }
  checkInteger(problems, 'maxBufferedPerKey', resolved.maxBufferedPerKey, 1);
  checkInteger(problems, 'maxBufferedTotal', resolved.maxBufferedTotal, 1);
  if (!OVERFLOWS.has(resolved.overflow)) {
    problems.push(
      `overflow must be 'backpressure' or 'dead-letter', got ${String(resolved.overflow)}`,
    );
  }
  checkInteger(problems, 'drainBatch', resolved.drainBatch, 1);
  checkDelay(problems, 'drainWaitMs', resolved.drainWaitMs, 0);
  if (resolved.sweepIntervalMs !== false) {
    checkDelay(problems, 'sweepIntervalMs', resolved.sweepIntervalMs, 1);
  }
  checkInteger(problems, 'sweepBatch', resolved.sweepBatch, 1);
  if (resolved.onGap !== undefined && typeof resolved.onGap !== 'function') {
    problems.push('onGap must be a function');
  }
  if (problems.length > 0) {
    throw new SequenceOptionsError('SequenceModule resequencer options', problems);
  }
  return resolved;
}

/** Problems of one resequencer definition (empty when it is valid). */
export function definitionProblems(definition: ResequencerDefinition): string[] {
  const problems: string[] = [];
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
    if (!POLICIES.has(gap.policy)) {
      problems.push(
        `gap.policy must be 'alert', 'skip' or 'dead-letter', got ${String(gap.policy)}`,
      );
    }
  }
  if (definition.maxBufferedPerKey !== undefined) {
    checkInteger(problems, 'maxBufferedPerKey', definition.maxBufferedPerKey, 1);
  }
  if (definition.overflow !== undefined && !OVERFLOWS.has(definition.overflow)) {
    problems.push(
      `overflow must be 'backpressure' or 'dead-letter', got ${String(definition.overflow)}`,
    );
  }
  return problems;
}

/** One resequencer with every default applied; what the runtime reads. */
export interface ResolvedResequencer {
  readonly name: string;
  readonly channel: string;
  readonly key: ResequencerField<string>;
  readonly seq: ResequencerField<number>;
  readonly output?: string;
  /** @default 1 (absent in a definition resolved by an earlier version) */
  readonly outputInFlight?: number;
  readonly callHandler: boolean;
  readonly start: number;
  readonly gap: { readonly timeoutMs: number; readonly policy: GapPolicy };
  readonly maxBufferedPerKey: number;
  readonly overflow: OverflowPolicy;
  readonly handlerRetry: Required<HandlerRetryOptions>;
  readonly prefetch: number;
  readonly deadLetterChannel: string;
}

/**
 * Validates `definition` and applies the module's defaults; throws {@link SequenceOptionsError}
 * naming `where` (the decorated method, or `ResequencerService.create`).
 */
export function resolveDefinition(
  where: string,
  definition: ResequencerDefinition,
  module: ResolvedResequencerModuleOptions,
  sequence: {
    handlerRetry: Required<HandlerRetryOptions>;
    prefetch: number;
    leaseMs: number;
    publish: { confirmTimeoutMs: number };
  },
  deadLetterChannelOf: (channel: string) => string,
): ResolvedResequencer {
  const problems = definitionProblems(definition);
  // A drainer renews its lease every third of leaseMs and stops a fifth before it could lapse,
  // which leaves 7/15 of leaseMs between a renewal due and that point; each publish attempt (up
  // to confirmTimeoutMs) must fit in it with room for the renewal's own round trip (a fifteenth
  // of leaseMs), or it could confirm an event after the next holder has delivered later ones (it
  // is never started: see DrainLease).
  const confirmCeiling = Math.floor((sequence.leaseMs * 2) / 5);
  if (sequence.publish.confirmTimeoutMs > confirmCeiling) {
    problems.push(
      `publish.confirmTimeoutMs (${sequence.publish.confirmTimeoutMs}) must be at most 2/5 of ` +
        `leaseMs (${sequence.leaseMs}), that is ${confirmCeiling} ms: a drainer must be able to ` +
        'finish a publish attempt before its drain lease could pass to another instance',
    );
  }
  const handlerRetry = { ...sequence.handlerRetry, ...definedOnly(definition.handlerRetry ?? {}) };
  checkInteger(problems, 'handlerRetry.attempts', handlerRetry.attempts, 1);
  checkDelay(problems, 'handlerRetry.baseDelayMs', handlerRetry.baseDelayMs, 0);
  const prefetch = definition.prefetch ?? sequence.prefetch;
  checkPrefetch(problems, 'prefetch', prefetch);
  if (definition.deadLetterChannel !== undefined && definition.deadLetterChannel.length === 0) {
    problems.push('deadLetterChannel must not be empty');
  }
  const inFlight = definition.outputInFlight;
  if (Number.isSafeInteger(inFlight) && (inFlight as number) > module.drainBatch) {
    problems.push(
      `outputInFlight (${inFlight}) must be at most the module's resequencer.drainBatch ` +
        `(${module.drainBatch}): a window never spans more than one claimed batch; raise ` +
        'drainBatch or lower outputInFlight',
    );
  }
  if (problems.length > 0) throw new SequenceOptionsError(where, problems);
  return {
    name: definition.name ?? definition.channel,
    channel: definition.channel,
    key: definition.key ?? ResequenceHeader.key,
    seq: definition.seq ?? ResequenceHeader.seq,
    output: definition.output,
    outputInFlight: definition.outputInFlight ?? 1,
    callHandler: definition.callHandler ?? definition.output === undefined,
    start: definition.start ?? RESEQUENCER_DEFAULTS.start,
    gap: { timeoutMs: definition.gap.timeoutMs, policy: definition.gap.policy },
    maxBufferedPerKey: definition.maxBufferedPerKey ?? module.maxBufferedPerKey,
    overflow: definition.overflow ?? module.overflow,
    handlerRetry,
    prefetch,
    deadLetterChannel: definition.deadLetterChannel ?? deadLetterChannelOf(definition.channel),
  };
}
