import { refuseUnknownKeys, type OptionKeysOf } from '../../../core/option-keys';
import type { Readable } from 'node:stream';
import {
  accountedAfter,
  accountedBytes,
  admitFragment,
  budgetIncrease,
  emptySequenceState,
  isComplete,
  channelBudget,
  missingPositions,
  neverFits,
  recordFragment,
  reservedAhead,
  storedCharge,
  userHeaderBytes,
  type FragmentFacts,
} from '../../../core/completeness';
import { deathReason } from '../../../core/errors/rejection-code';
import {
  BodyCipher,
  openUserHeaders,
  sequenceBodyIdentity,
  sequenceHeadersIdentity,
  type StoreEncryptionOptions,
} from '../../../core/body-cipher';
import { SealedBufferFailure } from '../../../core/sealed-buffer';
import { StoredFragmentDecryptionError } from '../../../core/errors/stored-fragment-decryption.error';
import type {
  AcceptContext,
  AcceptResult,
  CompleteSequence,
  ExpiredSequence,
  FinishContext,
  FinishedOutcome,
  FragmentRecord,
  OpenSequenceInfo,
  OpenSequenceQuery,
  SequenceRef,
  SequenceStatus,
  SequenceStore,
  SequenceStoreStats,
} from '../../../ports/sequence-store.port';
import {
  describeComplete,
  failingStream,
  isDue,
  openSequenceInfo,
  positionedBodies,
  sequenceKey,
  streamOf,
  type FinishedMarker,
  type HeldSequence,
  type RetainedFragments,
} from './memory-sequence';

/** Options of {@link MemorySequenceStore}. */
export interface MemorySequenceStoreOptions {
  /**
   * Keeps bodies and user headers AES-256-GCM encrypted in memory (see docs/security.md).
   * @default none
   */
  readonly encryption?: StoreEncryptionOptions;
}

const MEMORY_SEQUENCE_STORE_KEYS = {
  encryption: true,
} as const satisfies OptionKeysOf<MemorySequenceStoreOptions>;

/**
 * The default {@link SequenceStore}: fragments in this process's memory, for one consumer
 * instance (state is lost on restart, and other instances do not see it).
 *
 * Every method runs synchronously to its end once called, so concurrent `accept`s of one
 * sequence are serialized by the event loop: exactly one of them can see it complete.
 *
 * Budget: an open sequence counts core/completeness `accountedBytes` (bodies, kept headers, fixed
 * overheads, and a reservation ahead of its declared bytes no larger than what it stored); a
 * failed sequence's retained fragments count too, but are evicted, oldest first, before anything
 * is back-pressured for their sake; never for a fragment back-pressured without them (the open
 * sequences alone leave it no room, or its channel is at its budget).
 *
 * With `encryption`, bodies and user headers are held AES-256-GCM sealed (each under a fresh IV,
 * bound to its sequence and position) and opened as they are read; budgets count the plaintext.
 */
export class MemorySequenceStore implements SequenceStore {
  readonly name = 'memory';
  private readonly cipher?: BodyCipher;

  get encrypts(): boolean {
    return this.cipher !== undefined;
  }

  /** Open sequences, and complete ones not finished yet. */
  private readonly held = new Map<string, HeldSequence>();
  private readonly markers = new Map<string, FinishedMarker>();
  /** Failed sequences' fragments, in the order they failed (the eviction order). */
  private readonly retained = new Map<string, RetainedFragments>();
  /** Budget bytes of the held sequences. */
  private heldBytes = 0;
  /** The same, per scope. */
  private readonly heldBytesByScope = new Map<string, number>();
  private retainedBytes = 0;

  /** @throws SequenceOptionsError when an encryption key is missing, malformed or not 32 bytes. */
  constructor(options: MemorySequenceStoreOptions = {}) {
    refuseUnknownKeys('MemorySequenceStore options', options, MEMORY_SEQUENCE_STORE_KEYS);
    if (options.encryption !== undefined) {
      this.cipher = new BodyCipher(options.encryption, 'MemorySequenceStore encryption');
    }
  }

  async accept(fragment: FragmentRecord, context: AcceptContext): Promise<AcceptResult> {
    const { now, limits } = context;
    this.purgeOldest(now);
    const key = sequenceKey(fragment);
    const marker = this.liveMarker(key, now);
    if (marker) return { status: 'finished', outcome: marker.outcome, reason: marker.reason };

    const held = this.held.get(key);
    const facts: FragmentFacts = {
      ...fragment,
      bodyBytes: fragment.body.length,
      headerBytes: held ? 0 : userHeaderBytes(fragment.userHeaders),
    };
    const admission = admitFragment(held?.state ?? emptySequenceState(now), facts, limits);
    switch (admission.kind) {
      case 'contradiction':
        return { status: 'rejected', ...codeAndDetail(admission), sequenceRejected: false };
      case 'limit':
        // A first fragment over a limit stored nothing: it leaves no marker behind either.
        if (!held)
          return { status: 'rejected', ...codeAndDetail(admission), sequenceRejected: false };
        return this.rejectSequence(key, admission.code, admission.detail, context);
      case 'duplicate':
        return held && isComplete(held.state)
          ? this.claimCompletion(held, context)
          : { status: 'duplicate' };
      case 'new':
        break;
    }

    const increase = budgetIncrease(held?.state, facts);
    const tooLarge =
      increase > 0 ? neverFits(accountedAfter(held?.state, facts), limits) : undefined;
    if (tooLarge) {
      // It could never fit, even alone: refused, rather than back-pressured forever (and before
      // the open-sequence limit, which would only put the refusal off). An open sequence grown
      // that far (streamed, with no declared bytes) goes, as one past maxSequenceBytes does.
      if (held) return this.rejectSequence(key, 'sequence-too-large', tooLarge, context);
      return {
        status: 'rejected',
        code: 'sequence-too-large',
        detail: tooLarge,
        sequenceRejected: false,
      };
    }
    if (!held && this.held.size >= limits.maxOpenSequences) {
      return { status: 'backpressure', limit: 'maxOpenSequences' };
    }
    // Kept fragments of failed sequences go only to let this fragment in: not when it would be
    // back-pressured without them anyway (they count in no channel's budget).
    if (increase > 0 && this.heldBytes + increase > limits.maxBufferedBytes) {
      return { status: 'backpressure', limit: 'maxBufferedBytes' };
    }
    if (
      increase > 0 &&
      (this.heldBytesByScope.get(fragment.scope) ?? 0) + increase > channelBudget(limits)
    ) {
      return { status: 'backpressure', limit: 'maxChannelBufferedBytes' };
    }
    if (increase > 0) this.makeRoom(increase, limits.maxBufferedBytes);

    const sequence = held ?? this.open(fragment, context);
    const before = accountedBytes(sequence.state);
    recordFragment(sequence.state, facts, now);
    this.charge(fragment.scope, accountedBytes(sequence.state) - before);
    // A copy (sealing copies too): the caller may reuse its buffer, and a slice would pin a
    // larger one.
    sequence.bodies.set(
      fragment.position,
      this.cipher
        ? this.cipher.seal(fragment.body, sequenceBodyIdentity(fragment, fragment.position))
        : Buffer.from(fragment.body),
    );
    if (context.expiry.strategy === 'sliding') sequence.deadline = now + context.expiry.ms;

    const opened = held === undefined;
    if (!isComplete(sequence.state)) return { status: 'stored', opened };
    sequence.lease = { consumerId: context.consumerId, until: now + context.leaseMs };
    return { status: 'complete', opened, stored: true, sequence: this.describe(sequence) };
  }

  async renewLease(
    ref: SequenceRef,
    consumerId: string,
    leaseMs: number,
    now: number,
  ): Promise<boolean> {
    const lease = this.held.get(sequenceKey(ref))?.lease;
    if (!lease || lease.consumerId !== consumerId || lease.until <= now) return false;
    lease.until = now + leaseMs;
    return true;
  }

  async releaseLease(ref: SequenceRef, consumerId: string, now: number): Promise<void> {
    const lease = this.held.get(sequenceKey(ref))?.lease;
    if (lease?.consumerId === consumerId) lease.until = Math.min(lease.until, now);
  }

  read(ref: SequenceRef): Readable {
    const key = sequenceKey(ref);
    const held = this.held.get(key);
    const bodies = held && isComplete(held.state) ? held.bodies : this.retained.get(key)?.bodies;
    if (!bodies) {
      return failingStream(
        new Error(
          `sequence ${ref.sequenceId} (scope ${ref.scope}) is not complete or no longer held; ` +
            'read it between a complete accept and finish',
        ),
      );
    }
    const cipher = this.cipher;
    // A copy each: a reader that changes what it was handed (decoding in place) must not change
    // what a retry, or an inspection of a failed sequence, reads next.
    if (!cipher) return streamOf(positionedBodies(bodies), ({ body }) => Buffer.from(body));
    return streamOf(positionedBodies(bodies), ({ position, body }) => {
      try {
        return cipher.open(body, sequenceBodyIdentity(ref, position));
      } catch (error) {
        if (!(error instanceof SealedBufferFailure)) throw error;
        const crc32 = held?.state.crcByPosition.get(position) ?? Number.NaN;
        throw new StoredFragmentDecryptionError(
          ref.sequenceId,
          position,
          crc32,
          error.reason,
          error.keyId,
        );
      }
    });
  }

  async finish(
    ref: SequenceRef,
    outcome: Exclude<FinishedOutcome, 'expired'>,
    context: FinishContext,
  ): Promise<boolean> {
    const key = sequenceKey(ref);
    this.purgeOldest(context.now);
    if (this.liveMarker(key, context.now)) return false;
    const held = this.held.get(key);
    if (held?.lease && held.lease.consumerId !== context.consumerId) return false;
    const until = context.now + context.retentionMs;
    this.drop(key);
    this.dropRetained(key);
    if (outcome === 'failed' && held) {
      const bytes = storedCharge(held.state);
      this.retained.set(key, { bodies: held.bodies, bytes, until });
      this.retainedBytes += bytes;
    }
    this.mark(key, outcome, until, context.reason);
    return true;
  }

  async listExpired(now: number, limit: number): Promise<SequenceRef[]> {
    this.purge(now);
    const due: HeldSequence[] = [];
    for (const sequence of this.held.values()) {
      if (isDue(sequence, isComplete(sequence.state), now)) due.push(sequence);
    }
    return due
      .sort((a, b) => a.deadline - b.deadline)
      .slice(0, Math.max(0, limit))
      .map((sequence) => ({ ...sequence.ref }));
  }

  async expire(
    ref: SequenceRef,
    now: number,
    retentionMs: number,
  ): Promise<ExpiredSequence | null> {
    const key = sequenceKey(ref);
    const sequence = this.held.get(key);
    if (!sequence || !isDue(sequence, isComplete(sequence.state), now)) return null;
    const { state } = sequence;
    const receivedPositions = [...state.crcByPosition.keys()].sort((a, b) => a - b);
    const missing = missingPositions(receivedPositions, state.size);
    const ageMs = now - state.firstFragmentAt;
    this.drop(key);
    this.mark(
      key,
      'expired',
      now + retentionMs,
      `${missing.length} fragment(s) missing after ${ageMs} ms`,
    );
    return {
      scope: ref.scope,
      sequenceId: ref.sequenceId,
      receivedPositions,
      missingPositions: missing,
      size: state.size,
      bufferedBytes: state.storedBytes,
      firstFragmentAt: state.firstFragmentAt,
      lastFragmentAt: state.lastFragmentAt,
      ageMs,
    };
  }

  async stats(now: number): Promise<SequenceStoreStats> {
    let bufferedBytes = 0;
    let reservedBytes = 0;
    let oldestOpenAt: number | undefined;
    for (const { state } of this.held.values()) {
      bufferedBytes += storedCharge(state);
      reservedBytes += reservedAhead(state);
      oldestOpenAt = Math.min(oldestOpenAt ?? Infinity, state.firstFragmentAt);
    }
    for (const retained of this.retained.values()) {
      if (retained.until > now) bufferedBytes += retained.bytes;
    }
    return { openSequences: this.held.size, bufferedBytes, reservedBytes, oldestOpenAt };
  }

  async listOpen(query: OpenSequenceQuery): Promise<OpenSequenceInfo[]> {
    const listed: HeldSequence[] = [];
    for (const sequence of this.held.values()) {
      if (query.scope === undefined || sequence.ref.scope === query.scope) listed.push(sequence);
    }
    return listed
      .sort((a, b) => a.deadline - b.deadline)
      .slice(0, Math.max(0, query.limit))
      .map((sequence) => openSequenceInfo(sequence, query.now));
  }

  async status(ref: SequenceRef, now: number): Promise<SequenceStatus> {
    const key = sequenceKey(ref);
    const marker = this.liveMarker(key, now);
    if (marker) return { state: 'finished', outcome: marker.outcome, reason: marker.reason };
    return this.held.has(key) ? { state: 'open' } : { state: 'unknown' };
  }

  async inspect(ref: SequenceRef, now: number): Promise<OpenSequenceInfo | undefined> {
    const sequence = this.held.get(sequenceKey(ref));
    return sequence && openSequenceInfo(sequence, now);
  }

  async ping(): Promise<void> {}

  async close(): Promise<void> {
    this.held.clear();
    this.markers.clear();
    this.retained.clear();
    this.heldBytes = 0;
    this.heldBytesByScope.clear();
    this.retainedBytes = 0;
  }

  private open(fragment: FragmentRecord, context: AcceptContext): HeldSequence {
    const startedAt = Math.min(context.startedAt ?? context.now, context.now);
    const sequence: HeldSequence = {
      ref: { scope: fragment.scope, sequenceId: fragment.sequenceId },
      state: emptySequenceState(startedAt),
      bodies: new Map(),
      deadline: startedAt + context.expiry.ms,
      expiryMs: context.expiry.ms,
      userHeaders: this.cipher
        ? this.cipher.seal(
            Buffer.from(JSON.stringify(fragment.userHeaders)),
            sequenceHeadersIdentity(fragment),
          )
        : { ...fragment.userHeaders },
    };
    this.held.set(sequenceKey(fragment), sequence);
    return sequence;
  }

  /** Drops an open sequence over a limit and marks it rejected: its later fragments are refused. */
  private rejectSequence(
    key: string,
    code: 'sequence-too-large' | 'too-many-fragments',
    detail: string,
    context: AcceptContext,
  ): AcceptResult {
    this.drop(key);
    this.mark(key, 'rejected', context.now + context.retentionMs, deathReason(code, detail));
    return { status: 'rejected', code, detail, sequenceRejected: true };
  }

  /**
   * `complete` for a caller taking over a lapsed (or never taken) lease, else `in-progress`. Its
   * copy is not stored: the body held at its position stays the one stored first.
   */
  private claimCompletion(sequence: HeldSequence, context: AcceptContext): AcceptResult {
    if (sequence.lease && sequence.lease.until > context.now) return { status: 'in-progress' };
    sequence.lease = { consumerId: context.consumerId, until: context.now + context.leaseMs };
    return { status: 'complete', opened: false, stored: false, sequence: this.describe(sequence) };
  }

  /** The complete sequence for its caller, with its user headers opened when sealed. */
  private describe(sequence: HeldSequence): CompleteSequence {
    const { userHeaders } = sequence;
    if (!Buffer.isBuffer(userHeaders)) return describeComplete(sequence, userHeaders);
    const opened = openUserHeaders(this.cipher as BodyCipher, userHeaders, sequence.ref);
    const complete = describeComplete(sequence, opened.headers);
    return opened.failure === undefined
      ? complete
      : { ...complete, integrityFailure: opened.failure };
  }

  /**
   * Evicts failed sequences' fragments, oldest first, until `increase` more bytes fit; called
   * once the open sequences alone leave room for them.
   */
  private makeRoom(increase: number, maxBufferedBytes: number): void {
    for (const key of this.retained.keys()) {
      if (this.heldBytes + this.retainedBytes + increase <= maxBufferedBytes) return;
      this.dropRetained(key);
    }
  }

  private liveMarker(key: string, now: number): FinishedMarker | undefined {
    const marker = this.markers.get(key);
    if (!marker || marker.until > now) return marker;
    this.markers.delete(key);
    this.dropRetained(key);
    return undefined;
  }

  /**
   * Forgets the oldest markers and retained fragments that are past retention, a few at a time,
   * so the store stays bounded even on an instance that never sweeps. Maps keep insertion order,
   * which follows `until` as long as retention does not change, so the head is where they expire.
   */
  private purgeOldest(now: number, budget = 8): void {
    for (const [key, marker] of this.markers) {
      if (marker.until > now || budget-- <= 0) break;
      this.markers.delete(key);
    }
    for (const [key, retained] of this.retained) {
      if (retained.until > now || budget-- <= 0) break;
      this.dropRetained(key);
    }
  }

  private purge(now: number): void {
    for (const [key, marker] of this.markers) if (marker.until <= now) this.markers.delete(key);
    for (const [key, retained] of this.retained) if (retained.until <= now) this.dropRetained(key);
  }

  private mark(key: string, outcome: FinishedOutcome, until: number, reason?: string): void {
    this.markers.set(key, { outcome, reason, until });
  }

  private drop(key: string): void {
    const sequence = this.held.get(key);
    if (!sequence) return;
    this.charge(sequence.ref.scope, -accountedBytes(sequence.state));
    this.held.delete(key);
  }

  private charge(scope: string, delta: number): void {
    this.heldBytes += delta;
    const bytes = (this.heldBytesByScope.get(scope) ?? 0) + delta;
    if (bytes > 0) this.heldBytesByScope.set(scope, bytes);
    else this.heldBytesByScope.delete(scope);
  }

  private dropRetained(key: string): void {
    const retained = this.retained.get(key);
    if (!retained) return;
    this.retainedBytes -= retained.bytes;
    this.retained.delete(key);
  }
}

function codeAndDetail<T extends { code: unknown; detail: string }>(
  admission: T,
): { code: T['code']; detail: string } {
  return { code: admission.code, detail: admission.detail };
}
