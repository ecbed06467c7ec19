import type { Readable } from 'node:stream';
import type { FragmentHeaders, HeaderMap } from '../core/headers';
import type { RejectionCode } from '../core/errors/rejection-code';

/**
 * One validated fragment, as the aggregator hands it to a store. Sequences are isolated per
 * `scope` (the consuming channel): two services consuming copies of the same sequence from
 * their own queues never see each other's state.
 */
export interface FragmentRecord extends FragmentHeaders {
  readonly scope: string;
  readonly body: Buffer;
}

export interface SequenceLimits {
  /** Largest payload one sequence may reassemble to. */
  readonly maxSequenceBytes: number;
  /** Most fragments one sequence may have. */
  readonly maxFragments: number;
  /** Store-wide: budget bytes held (or reserved) for open sequences (core/completeness `accountedBytes`). */
  readonly maxBufferedBytes: number;
  /**
   * Per scope (consuming channel): budget bytes its open sequences may hold, so that one channel's
   * reservations cannot starve the others. @default maxBufferedBytes
   */
  readonly maxChannelBufferedBytes?: number;
  /** Store-wide: sequences open at once. */
  readonly maxOpenSequences: number;
}

export interface ExpiryPolicy {
  readonly ms: number;
  /** `fixed`: deadline from the first fragment; `sliding`: from the latest fragment. */
  readonly strategy: 'fixed' | 'sliding';
}

/** Everything `accept` needs besides the fragment; `now` is passed in so tests control time. */
export interface AcceptContext {
  readonly now: number;
  /** Identifies this consumer instance in completion leases. */
  readonly consumerId: string;
  /** How long the completion lease lasts before another instance may take over. */
  readonly leaseMs: number;
  readonly expiry: ExpiryPolicy;
  /**
   * When the sequence's first fragment was taken, on `now`'s clock, if before this store saw it
   * (a broker-held sequence moving to the store): a fragment that opens the sequence opens it as
   * of then, so its age and its fixed deadline count from then. Ignored for an open sequence, and
   * when later than `now`.
   */
  readonly startedAt?: number;
  readonly limits: SequenceLimits;
  /** How long a finished sequence's marker lives (late duplicates are recognised meanwhile). */
  readonly retentionMs: number;
}

/** What is known of a sequence whose every fragment is stored. */
export interface CompleteSequence {
  readonly scope: string;
  readonly sequenceId: string;
  readonly fragments: number;
  readonly bytes: number;
  readonly sha256?: string;
  /** `x-sequence-bytes` as declared, to check against `bytes`. */
  readonly declaredBytes?: number;
  readonly contentType?: string;
  readonly contentEncoding?: string;
  /** The producer's headers, from the first fragment stored. */
  readonly userHeaders: HeaderMap;
  readonly firstFragmentAt: number;
  readonly lastFragmentAt: number;
  /**
   * Set by a store that encrypts when the headers it kept with the sequence did not decrypt
   * (altered in the store): `userHeaders` is then empty, and the sequence must be failed as an
   * integrity mismatch with this reason, never delivered.
   */
  readonly integrityFailure?: string;
}

export type FinishedOutcome = 'completed' | 'failed' | 'rejected' | 'expired';

export interface FinishContext {
  readonly now: number;
  readonly retentionMs: number;
  /** The caller; it must hold the completion lease, if the sequence has one. */
  readonly consumerId: string;
  /** Why it failed or was rejected (an `x-death-reason` value). */
  readonly reason?: string;
}

/**
 * The result of `accept`:
 * - `stored`: new fragment kept; `opened` when it started the sequence.
 * - `duplicate`: this (id, position) was already stored with the same CRC; nothing changed.
 * - `complete`: every fragment is stored and the caller now holds the completion lease: it must
 *   reassemble, deliver and `finish` (or let the lease lapse for another instance to take over).
 *   Returned to the caller whose fragment completed the sequence (`stored: true`), and again to a
 *   later caller, a copy of a stored fragment, once a previous holder's lease has lapsed or was
 *   released (crash recovery): that copy stored nothing (`stored: false`), and the body held at
 *   its position may be another one, stored earlier, perhaps by another instance.
 * - `in-progress`: complete, and another consumer holds a live lease: retry later.
 * - `finished`: the sequence ended earlier (marker still retained); `outcome` says how.
 * - `rejected`: the fragment breaks the contract or a limit. When `sequenceRejected` is true the
 *   whole sequence was dropped (limit exceeded) and marked `rejected`.
 * - `backpressure`: a store-wide limit is reached; nothing was stored; retry later.
 */
export type AcceptResult =
  | { readonly status: 'stored'; readonly opened: boolean }
  | { readonly status: 'duplicate' }
  | {
      readonly status: 'complete';
      readonly opened: boolean;
      /**
       * Whether this call stored the fragment's body (see `complete` above). Absent, as from a
       * store written before it, counts as false: a sequence this instance hashed as it stored it
       * is then verified by reading it back all the same.
       */
      readonly stored?: boolean;
      readonly sequence: CompleteSequence;
    }
  | { readonly status: 'in-progress' }
  | { readonly status: 'finished'; readonly outcome: FinishedOutcome; readonly reason?: string }
  | {
      readonly status: 'rejected';
      readonly code: RejectionCode;
      readonly detail: string;
      readonly sequenceRejected: boolean;
    }
  | {
      readonly status: 'backpressure';
      readonly limit: 'maxBufferedBytes' | 'maxChannelBufferedBytes' | 'maxOpenSequences';
    };

/** A sequence that expired with fragments missing, as the sweeper reports it. */
export interface ExpiredSequence {
  readonly scope: string;
  readonly sequenceId: string;
  /** Positions that were stored, ascending. */
  readonly receivedPositions: number[];
  /** Positions known to be missing: up to the size when known, else up to the highest seen. */
  readonly missingPositions: number[];
  readonly size?: number;
  readonly bufferedBytes: number;
  readonly firstFragmentAt: number;
  readonly lastFragmentAt: number;
  /** ms from the first fragment to the expiry. */
  readonly ageMs: number;
}

export interface SequenceStoreStats {
  readonly openSequences: number;
  /**
   * Budget bytes held by what is stored: bodies, the headers kept with each sequence, and a fixed
   * overhead per sequence and per fragment (core/completeness `SEQUENCE_OVERHEAD_BYTES`,
   * `FRAGMENT_OVERHEAD_BYTES`); failed sequences' kept fragments included until retention ends.
   */
  readonly bufferedBytes: number;
  /**
   * Budget bytes held beyond `bufferedBytes`: reservations of open sequences ahead of the bytes
   * they declared (each at most what it stored), and grants in flight. `bufferedBytes +
   * reservedBytes` is what counts against `maxBufferedBytes`. Absent from stores that reserve
   * nothing.
   */
  readonly reservedBytes?: number;
  /** Arrival time of the oldest open sequence's first fragment, if any is open. */
  readonly oldestOpenAt?: number;
}

/**
 * An open sequence as an operator inspects it (`listOpen`, `inspect`): what is held, what is
 * missing, and who holds the completion lease, if anyone.
 */
export interface OpenSequenceInfo {
  readonly scope: string;
  readonly sequenceId: string;
  /** Positions stored, ascending. */
  readonly receivedPositions: readonly number[];
  /** Positions known to be missing: up to the size when known, else up to the highest seen. */
  readonly missingPositions: readonly number[];
  /** The number of fragments, once a fragment declared it. */
  readonly size?: number;
  /** Body bytes stored. */
  readonly bytes: number;
  /** `x-sequence-bytes`, once declared. */
  readonly declaredBytes?: number;
  readonly firstFragmentAt: number;
  readonly lastFragmentAt: number;
  /** When it expires if still incomplete (fixed from the first fragment, or sliding). */
  readonly deadline: number;
  /** Every fragment is stored: a consumer is reassembling it (or will take it over). */
  readonly complete: boolean;
  /** The consumer holding a live completion lease, if any. */
  readonly leaseHolder?: string;
}

/** What `listOpen` lists. */
export interface OpenSequenceQuery {
  /** Only this scope (consuming channel). */
  readonly scope?: string;
  /** At most this many, earliest deadline first. */
  readonly limit: number;
  readonly now: number;
}

/**
 * What a store knows of a sequence (`status`): for consumers that hold fragments outside the store
 * (broker-held reassembly) and keep only the completion marker in it.
 */
export type SequenceStatus =
  | { readonly state: 'unknown' }
  /** Fragments of it are stored (open, or complete and awaiting `finish`). */
  | { readonly state: 'open' }
  /** It finished: a live marker says how. */
  | { readonly state: 'finished'; readonly outcome: FinishedOutcome; readonly reason?: string };

export interface SequenceRef {
  readonly scope: string;
  readonly sequenceId: string;
}

/**
 * Port: where fragments wait until their sequence is complete.
 *
 * Contract, checked by the sequence-store conformance suite:
 * - `accept` is atomic per sequence: of concurrent callers storing the last missing fragments,
 *   exactly one receives `complete`. Duplicates by (scope, id, position) change nothing.
 * - Contradictions with what earlier fragments declared (size, last position, bytes, sha256, a
 *   different body at a stored position) are `rejected` and leave the sequence as it was.
 * - Limits: `maxSequenceBytes` / `maxFragments` reject and drop the whole sequence (marker
 *   `rejected`); a first fragment over them is rejected alone, leaving no marker, so rejections
 *   cost the store nothing to remember. So is a first fragment whose sequence could never fit
 *   the budget (`sequence-too-large`); an open sequence that grows past what it could ever hold
 *   (a streamed one, with no declared bytes) is rejected and dropped like one over
 *   `maxSequenceBytes`. `maxOpenSequences`, `maxBufferedBytes` and
 *   `maxChannelBufferedBytes` answer `backpressure` without storing. The budget counts
 *   core/completeness `accountedBytes`: bodies, kept headers, fixed overheads per sequence and
 *   fragment; a sequence that declares its bytes and size reserves them when it opens, so
 *   sequences already admitted can always complete.
 * - `read` streams a complete sequence's bodies in position order, without concatenating them.
 *   A store that sets `verifiesReads` checks every body it reads against the CRC-32 it was
 *   accepted with, and fails the stream with a `StoredFragmentIntegrityError` (never ends
 *   it short or with other bytes); the delivery then relies on that check instead of hashing the
 *   payload a second time while the handler reads it. A store that encrypts fails the stream
 *   with a `StoredFragmentDecryptionError` (a `StoredFragmentIntegrityError`) for a body that
 *   does not decrypt, and sets `CompleteSequence.integrityFailure` for headers that do not.
 * - `finish` ends a sequence unless it already finished or another consumer holds its lease (it
 *   took over after this caller's lease lapsed): then it resolves `false` and changes nothing, so
 *   a stale holder can never overwrite the outcome. `completed` drops its fragments; `failed` keeps them for
 *   inspection until `retentionMs`; both leave a marker for `retentionMs` so late duplicates
 *   get `finished`. Kept fragments count against `maxBufferedBytes` but are evicted, oldest
 *   first, as far as a fragment needs room; only when that admits it: a fragment back-pressured
 *   without them (open sequences alone fill the budget, or its channel is at
 *   `maxChannelBufferedBytes`) evicts none.
 * - `listExpired` returns open sequences whose deadline passed, and complete ones abandoned for
 *   longer than the expiry time after their lease lapsed (nobody redelivered a fragment to take
 *   them over); `expire` atomically claims one (null when another sweeper already did, or it was
 *   finished or taken over meanwhile), drops its fragments and marks it `expired`. Safe to call
 *   from several instances at once.
 * - Every piece of state is bounded in time (markers, failed fragments, open sequences).
 */
export interface SequenceStore {
  /** Short name for logs and health checks (`memory`, `redis`). */
  readonly name: string;
  accept(fragment: FragmentRecord, context: AcceptContext): Promise<AcceptResult>;
  /** Extends the completion lease; false when the caller no longer holds it. */
  renewLease(ref: SequenceRef, consumerId: string, leaseMs: number, now: number): Promise<boolean>;
  /**
   * Gives up the completion lease (after a transient failure) so that a redelivered fragment can
   * take the sequence over at once instead of waiting for the lease to lapse. No-op for others.
   */
  releaseLease(ref: SequenceRef, consumerId: string, now: number): Promise<void>;
  /**
   * The bodies of a complete sequence, in position order, in Buffers of the reader's own: one it
   * changes (a handler decoding in place) changes nothing that a later read returns.
   */
  read(ref: SequenceRef): Readable;
  /** `read` checks every body against its stored CRC-32 (see the contract above). */
  readonly verifiesReads?: boolean;
  /**
   * The store encrypts the bodies and user headers it keeps: broker-held reassembly, whose bodies
   * wait in a local spool file instead, then encrypts that file too.
   */
  readonly encrypts?: boolean;
  /** Resolves `true` when this caller finished the sequence (see the contract above). */
  finish(
    ref: SequenceRef,
    outcome: Exclude<FinishedOutcome, 'expired'>,
    context: FinishContext,
  ): Promise<boolean>;
  listExpired(now: number, limit: number): Promise<SequenceRef[]>;
  expire(ref: SequenceRef, now: number, retentionMs: number): Promise<ExpiredSequence | null>;
  stats(now: number): Promise<SequenceStoreStats>;
  /**
   * Open sequences (complete ones awaiting `finish` included), earliest deadline first, at most
   * `limit`: for the operator console. Read-only. Optional: a store without it cannot be listed.
   */
  listOpen?(query: OpenSequenceQuery): Promise<OpenSequenceInfo[]>;
  /**
   * Whether the sequence finished (a live marker), has fragments stored, or is unknown. Read-only.
   * `finish` of a sequence the store never saw writes its marker (nobody holds a lease), which is
   * how broker-held reassembly records an outcome. Optional: broker-held reassembly needs it, and
   * with `inspect` it tells a duplicate of a claim-checked fragment whose parked body is gone.
   */
  status?(ref: SequenceRef, now: number): Promise<SequenceStatus>;
  /**
   * One open sequence, or `undefined` when it is not open (finished, expired, never seen).
   * Optional: the operator console, and duplicates of claim-checked fragments (see `status`).
   */
  inspect?(ref: SequenceRef, now: number): Promise<OpenSequenceInfo | undefined>;
  /** Answers when the store is reachable (for health checks). */
  ping(): Promise<void>;
  close(): Promise<void>;
}
