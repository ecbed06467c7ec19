import type { RejectionCode } from './errors/rejection-code';
import type { FragmentHeaders } from './headers';
import { errorMessage } from './errors/caught';

/**
 * Admission rules of one sequence: which fragment is new, a duplicate, a contradiction of what
 * earlier fragments declared, or over a per-sequence limit. Pure: stores keep the state; the
 * Redis store's Lua script mirrors these rules, so change both together.
 */

/** What the admission rules read of one fragment. */
export type FragmentFacts = Pick<
  FragmentHeaders,
  'position' | 'size' | 'last' | 'crc32' | 'sha256' | 'bytes' | 'contentType' | 'contentEncoding'
> & {
  /** Length of this fragment's body. */
  readonly bodyBytes: number;
  /**
   * Length of this fragment's user headers as stored ({@link userHeaderBytes}); a sequence keeps
   * the headers of the fragment that opened it. 0 when omitted.
   */
  readonly headerBytes?: number;
};

/**
 * Budget charged for every open sequence besides its bytes: its state, index entries and key
 * names. Measured with empty one-fragment sequences: 1.2–1.4 KiB of Redis memory, 1.1 KiB of
 * heap in the memory store (fragment overheads included).
 */
export const SEQUENCE_OVERHEAD_BYTES = 1024;

/**
 * Budget charged for every stored fragment besides its body: its CRC and body entries, so that
 * empty and tiny fragments are never free. Measured: about 250 bytes of heap per empty fragment
 * in the memory store; less in Redis, whose small hashes are packed.
 */
export const FRAGMENT_OVERHEAD_BYTES = 256;

/** Bytes of a fragment's user headers as a store keeps them (their JSON, UTF-8). */
export function userHeaderBytes(headers: object): number {
  return Buffer.byteLength(JSON.stringify(headers));
}

/**
 * Why a fragment's user headers cannot be kept with its sequence: over `maxHeaderBytes`, or not
 * representable as JSON (a value a broker client decoded into something JSON cannot hold).
 */
export function userHeadersRefusal(
  headers: object,
  maxHeaderBytes: number,
):
  { readonly code: 'headers-too-large' | 'malformed-header'; readonly detail: string } | undefined {
  let bytes: number;
  try {
    bytes = userHeaderBytes(headers);
  } catch (error) {
    const why = errorMessage(error);
    return { code: 'malformed-header', detail: `the user headers cannot be stored: ${why}` };
  }
  if (bytes <= maxHeaderBytes) return undefined;
  return {
    code: 'headers-too-large',
    detail: `user headers take ${bytes} bytes, over maxHeaderBytes (${maxHeaderBytes})`,
  };
}

/** The per-sequence limits admission enforces. */
export interface AdmissionLimits {
  readonly maxSequenceBytes: number;
  readonly maxFragments: number;
}

/** What a store remembers of an open sequence, besides the bodies. */
export interface SequenceState {
  /** Number of fragments, once any fragment declared it. */
  size?: number;
  /** Position of the fragment flagged last, once it is stored. */
  lastPosition?: number;
  /** `x-sequence-bytes`, once declared; also the bytes this sequence reserves in the store. */
  declaredBytes?: number;
  sha256?: string;
  /** `content-type`, once a fragment carried one. */
  contentType?: string;
  /** `content-encoding`, once a fragment carried one. */
  contentEncoding?: string;
  /** CRC-32 of each stored position. */
  readonly crcByPosition: Map<number, number>;
  /** Highest stored position (0 when none). */
  highestPosition: number;
  /** Sum of stored body lengths. */
  storedBytes: number;
  /** The user headers kept with the sequence (those of its first fragment), in bytes. */
  headerBytes: number;
  firstFragmentAt: number;
  lastFragmentAt: number;
}

export type Admission =
  | { readonly kind: 'new' }
  | { readonly kind: 'duplicate' }
  | {
      readonly kind: 'contradiction';
      readonly code: Extract<
        RejectionCode,
        | 'conflicting-duplicate'
        | 'size-changed'
        | 'position-out-of-range'
        | 'duplicate-last'
        | 'declaration-changed'
        | 'malformed-header'
      >;
      readonly detail: string;
    }
  | {
      readonly kind: 'limit';
      readonly code: Extract<RejectionCode, 'sequence-too-large' | 'too-many-fragments'>;
      readonly detail: string;
    };

/** The state of a sequence that has no fragment yet. */
export function emptySequenceState(now: number): SequenceState {
  return {
    crcByPosition: new Map(),
    highestPosition: 0,
    storedBytes: 0,
    headerBytes: 0,
    firstFragmentAt: now,
    lastFragmentAt: now,
  };
}

/**
 * Decides what a fragment is to its sequence, without changing the state. Contradictions are
 * checked first (they reject the fragment only), then duplicates, then limits (which reject the
 * whole sequence).
 */
export function admitFragment(
  state: SequenceState,
  fragment: FragmentFacts,
  limits: AdmissionLimits,
): Admission {
  const contradiction = findContradiction(state, fragment);
  if (contradiction) return contradiction;

  const storedCrc = state.crcByPosition.get(fragment.position);
  if (storedCrc !== undefined) {
    if (storedCrc === fragment.crc32) return { kind: 'duplicate' };
    return {
      kind: 'contradiction',
      code: 'conflicting-duplicate',
      detail:
        `position ${fragment.position} is stored with crc32 ${storedCrc}, ` +
        `this copy has crc32 ${fragment.crc32}`,
    };
  }

  // Checked after duplicates, which add no bytes.
  const declaredBytes = state.declaredBytes ?? fragment.bytes;
  if (declaredBytes !== undefined && state.storedBytes + fragment.bodyBytes > declaredBytes) {
    return {
      kind: 'contradiction',
      code: 'declaration-changed',
      detail:
        `${state.storedBytes + fragment.bodyBytes} bytes received exceed the declared ` +
        `x-sequence-bytes ${declaredBytes}`,
    };
  }

  const fragments = Math.max(fragment.size ?? 0, fragment.position);
  if (fragments > limits.maxFragments) {
    return {
      kind: 'limit',
      code: 'too-many-fragments',
      detail: `${fragment.size !== undefined ? `size ${fragment.size}` : `position ${fragment.position}`} exceeds maxFragments (${limits.maxFragments})`,
    };
  }
  if (fragment.bytes !== undefined && fragment.bytes > limits.maxSequenceBytes) {
    return {
      kind: 'limit',
      code: 'sequence-too-large',
      detail: `declared ${fragment.bytes} bytes exceed maxSequenceBytes (${limits.maxSequenceBytes})`,
    };
  }
  if (state.storedBytes + fragment.bodyBytes > limits.maxSequenceBytes) {
    return {
      kind: 'limit',
      code: 'sequence-too-large',
      detail:
        `${state.storedBytes + fragment.bodyBytes} bytes received exceed maxSequenceBytes ` +
        `(${limits.maxSequenceBytes})`,
    };
  }
  return { kind: 'new' };
}

function findContradiction(
  state: SequenceState,
  fragment: FragmentFacts,
): Extract<Admission, { kind: 'contradiction' }> | undefined {
  const reject = (
    code: Extract<Admission, { kind: 'contradiction' }>['code'],
    detail: string,
  ): Extract<Admission, { kind: 'contradiction' }> => ({ kind: 'contradiction', code, detail });
  const { position, size } = fragment;

  if (fragment.last && state.lastPosition !== undefined && position !== state.lastPosition) {
    return reject(
      'duplicate-last',
      `position ${position} claims to be last, position ${state.lastPosition} already is`,
    );
  }
  if (size !== undefined && state.size !== undefined && size !== state.size) {
    return reject('size-changed', `size ${size} differs from the declared size ${state.size}`);
  }
  const knownSize = state.size ?? size;
  if (knownSize !== undefined && position > knownSize) {
    return reject('position-out-of-range', `position ${position} is beyond size ${knownSize}`);
  }
  // The wire contract puts the last flag (and the whole's SHA-256) on the fragment at the size's
  // position: without it, this one would complete the sequence with nothing to verify it by.
  if (knownSize !== undefined && position === knownSize && !fragment.last) {
    return reject(
      'malformed-header',
      `position ${position} is the last one (size ${knownSize}) but x-sequence-last is not set`,
    );
  }
  if (state.lastPosition !== undefined && position > state.lastPosition) {
    return reject(
      'position-out-of-range',
      `position ${position} is beyond the last position ${state.lastPosition}`,
    );
  }
  if (size !== undefined && state.highestPosition > size) {
    return reject(
      'position-out-of-range',
      `size ${size} is below the stored position ${state.highestPosition}`,
    );
  }
  // The same rule, seen from the other side: the size arrives after the fragment at its position,
  // which came without the last flag (a streamed producer's ordinary fragment).
  if (
    size !== undefined &&
    state.size === undefined &&
    position !== size &&
    state.lastPosition !== size &&
    state.crcByPosition.has(size)
  ) {
    return reject(
      'malformed-header',
      `size ${size} makes position ${size} the last one, but it was stored without x-sequence-last`,
    );
  }
  if (
    fragment.bytes !== undefined &&
    state.declaredBytes !== undefined &&
    fragment.bytes !== state.declaredBytes
  ) {
    return reject(
      'declaration-changed',
      `x-sequence-bytes ${fragment.bytes} differs from the declared ${state.declaredBytes}`,
    );
  }
  if (
    fragment.sha256 !== undefined &&
    state.sha256 !== undefined &&
    fragment.sha256 !== state.sha256
  ) {
    return reject(
      'declaration-changed',
      `x-sequence-sha256 ${fragment.sha256} differs from the declared ${state.sha256}`,
    );
  }
  // A fragment that carries none agrees with any: the first one carried is the sequence's.
  if (
    fragment.contentType !== undefined &&
    state.contentType !== undefined &&
    fragment.contentType !== state.contentType
  ) {
    return reject(
      'declaration-changed',
      `content-type ${fragment.contentType} differs from the declared ${state.contentType}`,
    );
  }
  if (
    fragment.contentEncoding !== undefined &&
    state.contentEncoding !== undefined &&
    fragment.contentEncoding !== state.contentEncoding
  ) {
    return reject(
      'declaration-changed',
      `content-encoding ${fragment.contentEncoding} differs from the declared ${state.contentEncoding}`,
    );
  }
  return undefined;
}

/** Records a fragment that {@link admitFragment} found `new`. Mutates `state`. */
export function recordFragment(state: SequenceState, fragment: FragmentFacts, now: number): void {
  if (state.crcByPosition.size === 0) state.headerBytes = fragment.headerBytes ?? 0;
  state.crcByPosition.set(fragment.position, fragment.crc32);
  state.highestPosition = Math.max(state.highestPosition, fragment.position);
  state.storedBytes += fragment.bodyBytes;
  state.lastFragmentAt = now;
  if (fragment.size !== undefined) state.size = fragment.size;
  if (fragment.last) state.lastPosition = fragment.position;
  if (fragment.bytes !== undefined) state.declaredBytes = fragment.bytes;
  if (fragment.sha256 !== undefined) state.sha256 = fragment.sha256;
  if (fragment.contentType !== undefined) state.contentType ??= fragment.contentType;
  if (fragment.contentEncoding !== undefined) state.contentEncoding ??= fragment.contentEncoding;
}

/** True when the size is known and every position from 1 to it is stored. */
export function isComplete(state: SequenceState): boolean {
  return (
    state.size !== undefined &&
    state.highestPosition <= state.size &&
    state.crcByPosition.size === state.size
  );
}

/** Positions not received: up to `size` when known, else up to the highest received. */
export function missingPositions(received: Iterable<number>, size?: number): number[] {
  const have = new Set(received);
  let upTo = size ?? 0;
  if (size === undefined) for (const position of have) upTo = Math.max(upTo, position);
  const missing: number[] = [];
  for (let position = 1; position <= upTo; position++) {
    if (!have.has(position)) missing.push(position);
  }
  return missing;
}

/**
 * Budget bytes a sequence holds against `maxBufferedBytes` and its channel's
 * `maxChannelBufferedBytes`: a fixed overhead per sequence, the headers it keeps, a fixed overhead
 * per fragment (for every fragment it declared, from the moment it declares them) and its body
 * bytes (its declared `x-sequence-bytes` from the moment it declares them, or what it stored if
 * more). Reserving what a sequence declared when it opens means an admitted sequence never needs
 * more budget, so it always completes; the per-channel budget keeps one channel's reservations
 * from starving the others.
 */
export function accountedBytes(state: SequenceState | undefined): number {
  if (state === undefined || state.crcByPosition.size === 0) return 0;
  return charge(
    state.headerBytes,
    Math.max(state.crcByPosition.size, state.size ?? 0),
    Math.max(state.declaredBytes ?? 0, state.storedBytes),
  );
}

/** The part of {@link accountedBytes} held by what is stored: bodies, headers, overheads. */
export function storedCharge(state: SequenceState): number {
  if (state.crcByPosition.size === 0) return 0;
  return charge(state.headerBytes, state.crcByPosition.size, state.storedBytes);
}

/** The part of {@link accountedBytes} reserved for declared fragments and bytes not stored yet. */
export function reservedAhead(state: SequenceState): number {
  return accountedBytes(state) - storedCharge(state);
}

/** What {@link accountedBytes} would be once `fragment` (found `new`) is recorded. */
export function accountedAfter(state: SequenceState | undefined, fragment: FragmentFacts): number {
  const opening = state === undefined || state.crcByPosition.size === 0;
  const stored = (state?.storedBytes ?? 0) + fragment.bodyBytes;
  const fragments = Math.max(
    (state?.crcByPosition.size ?? 0) + 1,
    state?.size ?? fragment.size ?? 0,
  );
  return charge(
    opening ? (fragment.headerBytes ?? 0) : state.headerBytes,
    fragments,
    Math.max(state?.declaredBytes ?? fragment.bytes ?? 0, stored),
  );
}

/** How many more budget bytes admitting this fragment needs. */
export function budgetIncrease(state: SequenceState | undefined, fragment: FragmentFacts): number {
  return Math.max(0, accountedAfter(state, fragment) - accountedBytes(state));
}

/** The budget of one channel's open sequences: `maxChannelBufferedBytes`, else the store's. */
export function channelBudget(limits: BudgetLimits): number {
  return limits.maxChannelBufferedBytes ?? limits.maxBufferedBytes;
}

/**
 * Why a sequence that needs `bytes` of budget to open can never open, even alone (over the
 * store's budget or its channel's); undefined when it can.
 */
export function neverFits(bytes: number, limits: BudgetLimits): string | undefined {
  const channel = channelBudget(limits);
  const [limit, name] =
    channel < limits.maxBufferedBytes
      ? [channel, 'maxChannelBufferedBytes']
      : [limits.maxBufferedBytes, 'maxBufferedBytes'];
  if (bytes <= limit) return undefined;
  return `the sequence needs ${bytes} budget bytes with its overheads, more than ${name} (${limit})`;
}

/** The store-wide budgets, as a store's limits carry them. */
export interface BudgetLimits {
  readonly maxBufferedBytes: number;
  readonly maxChannelBufferedBytes?: number;
}

function charge(headerBytes: number, fragments: number, bodyBytes: number): number {
  return SEQUENCE_OVERHEAD_BYTES + headerBytes + fragments * FRAGMENT_OVERHEAD_BYTES + bodyBytes;
}
