/** Argument checks every ResequencerStore adapter applies the same way (RangeError, naming the argument). */
import {
  assertResequencerArguments,
  isSequenceNumber,
  MAX_SEQUENCE_NUMBER,
  type DrainContext,
  type GapPolicy,
  type ResequencerKey,
  type ResequencerLimits,
} from './resequencer-store.port';

/** Throws a `RangeError` unless `value` is an integer >= 1 (a limit, a lease, a count). */
export function assertPositiveInteger(name: string, value: number): void {
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new RangeError(`resequencer store: ${name} must be a positive integer, got ${value}`);
  }
}

/** Throws a `RangeError` unless `value` is an integer time in ms. */
export function assertTime(name: string, value: number): void {
  if (!Number.isSafeInteger(value)) {
    throw new RangeError(`resequencer store: ${name} must be an integer time (ms), got ${value}`);
  }
}

/** Throws a `RangeError` unless every limit given is a positive integer. */
export function assertLimits(limits: ResequencerLimits): void {
  assertPositiveInteger('maxBufferedPerKey', limits.maxBufferedPerKey);
  assertPositiveInteger('maxBufferedTotal', limits.maxBufferedTotal);
  if (limits.maxBufferedBytesPerKey !== undefined) {
    assertPositiveInteger('maxBufferedBytesPerKey', limits.maxBufferedBytesPerKey);
  }
  if (limits.maxBufferedBytesTotal !== undefined) {
    assertPositiveInteger('maxBufferedBytesTotal', limits.maxBufferedBytesTotal);
  }
  if (limits.maxSeqAhead !== undefined) assertPositiveInteger('maxSeqAhead', limits.maxSeqAhead);
}

export function assertStart(start: number): void {
  if (!isSequenceNumber(start)) {
    throw new RangeError(
      `resequencer store: start ${String(start)} must be an integer from 0 to ${MAX_SEQUENCE_NUMBER}`,
    );
  }
}

export function assertHolder(holder: string): void {
  if (typeof holder !== 'string' || holder.length === 0) {
    throw new RangeError(
      `resequencer store: a drain holder must be a non-empty string, got ${JSON.stringify(holder)}`,
    );
  }
}

export function assertDrainArguments(key: ResequencerKey, context: DrainContext): void {
  assertResequencerArguments(key);
  assertHolder(context.holder);
  assertPositiveInteger('leaseMs', context.leaseMs);
  assertPositiveInteger('limit', context.limit);
}

export function assertScope(scope: string): void {
  if (typeof scope !== 'string' || scope.length === 0) {
    throw new RangeError('a resequencer scope must be a non-empty string');
  }
}

const GAP_POLICIES: readonly GapPolicy[] = ['alert', 'skip', 'dead-letter'];

export function assertGapPolicy(policy: GapPolicy): void {
  if (!GAP_POLICIES.includes(policy)) {
    throw new RangeError(
      `resequencer store: gap policy ${JSON.stringify(policy)} must be one of ${GAP_POLICIES.join(', ')}`,
    );
  }
}
