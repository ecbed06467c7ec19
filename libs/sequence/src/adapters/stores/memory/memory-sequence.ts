import { Readable } from 'node:stream';
import { isComplete, missingPositions, type SequenceState } from '../../../core/completeness';
import type { HeaderMap } from '../../../core/headers';
import type {
  CompleteSequence,
  FinishedOutcome,
  OpenSequenceInfo,
  SequenceRef,
} from '../../../ports/sequence-store.port';

/** A sequence the memory store holds: open, or complete and awaiting `finish`. */
export interface HeldSequence {
  readonly ref: SequenceRef;
  readonly state: SequenceState;
  readonly bodies: Map<number, Buffer>;
  /** When it expires if still incomplete (fixed or sliding). */
  deadline: number;
  /** The expiry time it opened with; also how long a complete one may sit with no lease. */
  readonly expiryMs: number;
  /** The producer's headers, from the first fragment stored: their JSON, sealed when encrypted. */
  readonly userHeaders: HeaderMap | Buffer;
  /** Set once complete: who reassembles it, and until when. */
  lease?: { consumerId: string; until: number };
}

/** What remains of a finished sequence until `until`, so that late fragments get `finished`. */
export interface FinishedMarker {
  readonly outcome: FinishedOutcome;
  readonly reason?: string;
  readonly until: number;
}

/** A failed sequence's fragments, kept for inspection until `until`. */
export interface RetainedFragments {
  readonly bodies: Map<number, Buffer>;
  readonly bytes: number;
  readonly until: number;
}

/**
 * Due for expiry: incomplete past its deadline, or complete with its lease lapsed for longer
 * than its expiry time (abandoned: no redelivery came to take it over).
 */
export function isDue(held: HeldSequence, complete: boolean, now: number): boolean {
  if (!complete) return held.deadline <= now;
  return (held.lease?.until ?? held.state.lastFragmentAt) + held.expiryMs <= now;
}

/** Map key of a sequence: the same id in two scopes is two sequences. */
export function sequenceKey(ref: SequenceRef): string {
  return JSON.stringify([ref.scope, ref.sequenceId]);
}

/** `userHeaders`: the held ones, opened when they are sealed. */
export function describeComplete(held: HeldSequence, userHeaders: HeaderMap): CompleteSequence {
  const { state } = held;
  return {
    scope: held.ref.scope,
    sequenceId: held.ref.sequenceId,
    fragments: state.crcByPosition.size,
    bytes: state.storedBytes,
    sha256: state.sha256,
    declaredBytes: state.declaredBytes,
    contentType: state.contentType,
    contentEncoding: state.contentEncoding,
    userHeaders: { ...userHeaders },
    firstFragmentAt: state.firstFragmentAt,
    lastFragmentAt: state.lastFragmentAt,
  };
}

/** The bodies in position order, with their positions. */
export function positionedBodies(
  bodies: ReadonlyMap<number, Buffer>,
): Array<{ readonly position: number; readonly body: Buffer }> {
  return [...bodies.entries()]
    .sort(([a], [b]) => a - b)
    .map(([position, body]) => ({ position, body }));
}

/**
 * A byte stream over the given bodies, one chunk per body, each passed through `open` (which
 * decrypts a sealed body, and fails the stream by throwing) as it is pushed. A one-byte
 * high-water mark keeps at most one body in the stream's buffer, so `read()` never hands out
 * several bodies joined.
 */
export function streamOf<T>(bodies: readonly T[], open: (body: T) => Buffer): Readable {
  let next = 0;
  return new Readable({
    highWaterMark: 1,
    read() {
      try {
        for (;;) {
          if (next >= bodies.length) return void this.push(null);
          const body = open(bodies[next++]);
          // An empty chunk would end nothing and push nothing: skip empty bodies.
          if (body.length > 0) return void this.push(body);
        }
      } catch (error) {
        this.destroy(error as Error);
      }
    },
  });
}

/** A stream that fails at the first read, for `read` of a sequence that cannot be read. */
export function failingStream(error: Error): Readable {
  return new Readable({
    read() {
      this.destroy(error);
    },
  });
}

/** A held sequence as `listOpen` and `inspect` describe it. */
export function openSequenceInfo(held: HeldSequence, now: number): OpenSequenceInfo {
  const { state, lease } = held;
  const receivedPositions = [...state.crcByPosition.keys()].sort((a, b) => a - b);
  return {
    scope: held.ref.scope,
    sequenceId: held.ref.sequenceId,
    receivedPositions,
    missingPositions: missingPositions(receivedPositions, state.size),
    size: state.size,
    bytes: state.storedBytes,
    declaredBytes: state.declaredBytes,
    firstFragmentAt: state.firstFragmentAt,
    lastFragmentAt: state.lastFragmentAt,
    deadline: held.deadline,
    complete: isComplete(state),
    leaseHolder: lease && lease.until > now ? lease.consumerId : undefined,
  };
}
