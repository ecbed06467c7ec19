import type { SequenceEvents } from '../kernel/lifecycle-events';
import type { FragmentHeaders } from '../core/headers';
import type { CompleteSequence, ExpiredSequence } from '../ports/sequence-store.port';

/** A fragment's ids, when its headers could be read. */
export interface FragmentIds {
  readonly sequenceId: string;
  readonly position: number;
}

/**
 * Message Sequence's lifecycle events, one method per emission point: each returns at once when
 * nothing listens, before reading a clock or building anything.
 */
export class SequenceLifecycle {
  constructor(readonly events: SequenceEvents) {}

  /** `Date.now()` while something listens, else 0: for timings only an event carries. */
  clock(): number {
    return this.events.listening ? Date.now() : 0;
  }

  started(channel: string, fragment: FragmentHeaders): void {
    if (!this.events.listeningTo('sequence.started')) return;
    this.events.emit(() => ({
      type: 'sequence.started',
      at: Date.now(),
      channel,
      sequenceId: fragment.sequenceId,
      ...(fragment.size !== undefined ? { fragments: fragment.size } : {}),
      ...(fragment.bytes !== undefined ? { bytes: fragment.bytes } : {}),
    }));
  }

  completed(
    channel: string,
    sequence: Pick<CompleteSequence, 'sequenceId' | 'fragments' | 'bytes' | 'firstFragmentAt'>,
    attempts: number,
  ): void {
    if (!this.events.listeningTo('sequence.completed')) return;
    const at = Date.now();
    this.events.emit(() => ({
      type: 'sequence.completed',
      at,
      channel,
      sequenceId: sequence.sequenceId,
      fragments: sequence.fragments,
      bytes: sequence.bytes,
      durationMs: Math.max(0, at - sequence.firstFragmentAt),
      attempts,
    }));
  }

  expired(channel: string, expired: ExpiredSequence): void {
    if (!this.events.listeningTo('sequence.expired')) return;
    this.events.emit(() => ({
      type: 'sequence.expired',
      at: Date.now(),
      channel,
      sequenceId: expired.sequenceId,
      receivedFragments: expired.receivedPositions.length,
      missingFragments: expired.missingPositions.length,
      ...(expired.size !== undefined ? { fragments: expired.size } : {}),
      bytes: expired.bufferedBytes,
      ageMs: expired.ageMs,
    }));
  }

  rejected(channel: string, sequenceId: string, reason: string, detail: string): void {
    if (!this.events.listeningTo('sequence.rejected')) return;
    this.events.emit(() => ({
      type: 'sequence.rejected',
      at: Date.now(),
      channel,
      sequenceId,
      reason,
      detail,
    }));
  }

  failed(
    channel: string,
    sequenceId: string,
    reason: string,
    detail: string,
    attempts: number,
  ): void {
    if (!this.events.listeningTo('sequence.failed')) return;
    this.events.emit(() => ({
      type: 'sequence.failed',
      at: Date.now(),
      channel,
      sequenceId,
      reason,
      detail,
      attempts,
    }));
  }

  fragmentAccepted(channel: string, fragment: FragmentHeaders, bytes: number): void {
    if (!this.events.listeningTo('fragment.accepted')) return;
    this.events.emit(() => ({
      type: 'fragment.accepted',
      at: Date.now(),
      channel,
      sequenceId: fragment.sequenceId,
      position: fragment.position,
      bytes,
      last: fragment.last,
    }));
  }

  fragmentDuplicate(channel: string, fragment: FragmentIds): void {
    if (!this.events.listeningTo('fragment.duplicate')) return;
    this.events.emit(() => ({
      type: 'fragment.duplicate',
      at: Date.now(),
      channel,
      sequenceId: fragment.sequenceId,
      position: fragment.position,
    }));
  }

  fragmentRejected(
    channel: string,
    reason: string,
    detail: string,
    fragment: FragmentIds | undefined,
  ): void {
    if (!this.events.listeningTo('fragment.rejected')) return;
    this.events.emit(() => ({
      type: 'fragment.rejected',
      at: Date.now(),
      channel,
      ...(fragment ? { sequenceId: fragment.sequenceId, position: fragment.position } : {}),
      reason,
      detail,
    }));
  }
}
