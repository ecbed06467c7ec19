import { MessageRefusedError } from '../core/errors/message-refused.error';
import { handlerRejection } from '../kernel/handler-retry';
import type { FragmentHeaders } from '../core/headers';
import type { SequenceLifecycle } from './sequence.events';
import type { SequenceMetrics } from './sequence.metrics';

/** Sequences whose start time one stream consumer remembers at once (for `durationMs`). */
const REMEMBERED_STARTS = 4096;

/**
 * Stream mode's lifecycle events and sequence metrics. The resequencer under it hands each
 * fragment to the handler once, in order, whichever instance took it: `sequence.started` (and
 * `sequences_started_total`) goes with position 1, each fragment's `fragment.accepted` once the
 * handler took it, `sequence.completed` (`sequences_completed_total`, `reassembly_latency_seconds`)
 * with the last. `durationMs` and the latency are from the first fragment this instance delivered.
 */
export class StreamLifecycle {
  private readonly startedAt = new Map<string, number>();

  constructor(
    private readonly lifecycle: SequenceLifecycle,
    private readonly metrics: SequenceMetrics,
    private readonly channel: string,
    private readonly attempts: number,
  ) {}

  /** Before the handler is called with `fragment` (`attempt`: 1 for the first call). */
  delivering(fragment: FragmentHeaders, attempt: number): void {
    const { sequenceId } = fragment;
    if (!this.startedAt.has(sequenceId)) {
      if (this.startedAt.size >= REMEMBERED_STARTS) {
        this.startedAt.delete(this.startedAt.keys().next().value as string);
      }
      this.startedAt.set(sequenceId, Date.now());
    }
    // Once per sequence, not again when the handler is retried.
    if (fragment.position !== 1 || attempt !== 1) return;
    this.metrics.sequenceStarted(this.channel);
    if (this.lifecycle.events.listening) this.lifecycle.started(this.channel, fragment);
  }

  /** After the handler took `fragment` (`bytes`: the sequence's bytes streamed so far). */
  delivered(fragment: FragmentHeaders, bodyBytes: number, streamed: number, attempts: number) {
    const listening = this.lifecycle.events.listening;
    if (listening) this.lifecycle.fragmentAccepted(this.channel, fragment, bodyBytes);
    if (!fragment.last) return;
    const startedAt = this.startedAt.get(fragment.sequenceId);
    this.startedAt.delete(fragment.sequenceId);
    // Not followed here from its first fragment (another instance delivered it): no latency.
    this.metrics.sequenceCompleted(this.channel, startedAt);
    if (!listening) return;
    const firstFragmentAt = startedAt ?? Date.now();
    const { sequenceId, position } = fragment;
    const sequence = { sequenceId, fragments: position, bytes: streamed, firstFragmentAt };
    this.lifecycle.completed(this.channel, sequence, attempts);
  }

  /** After a handler call failed: `sequence.failed` when no retry follows. */
  handlerFailed(fragment: FragmentHeaders, error: unknown, attempt: number): void {
    const refused = error instanceof MessageRefusedError;
    // A refusal is the module's verdict on the fragment, not a failed call (as in reassembly).
    if (!refused) this.metrics.handlerFailed(this.channel);
    const final = refused || attempt >= this.attempts;
    if (final) this.startedAt.delete(fragment.sequenceId);
    if (!this.lifecycle.events.listening) return;
    if (!final) return;
    const subject = `sequence ${fragment.sequenceId} fragment ${fragment.position}`;
    const { code, detail } = handlerRejection(subject, { attempts: attempt, error });
    this.lifecycle.failed(this.channel, fragment.sequenceId, code, detail, attempt);
  }
}
