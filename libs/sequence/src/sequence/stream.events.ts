import { MessageRefusedError } from '../core/errors/message-refused.error';
import { handlerRejection } from '../kernel/handler-retry';
import type { FragmentHeaders } from '../core/headers';
import type { SequenceLifecycle } from './sequence.events';

/** Sequences whose start time one stream consumer remembers at once (for `durationMs`). */
const REMEMBERED_STARTS = 4096;

/**
 * Stream mode's lifecycle events. The resequencer under it hands each fragment to the handler
 * once, in order, whichever instance took it: `sequence.started` goes with position 1, each
 * fragment's `fragment.accepted` once the handler took it, `sequence.completed` with the last.
 * `durationMs` is from the first fragment this instance delivered.
 */
export class StreamLifecycle {
  private readonly startedAt = new Map<string, number>();

  constructor(
    private readonly lifecycle: SequenceLifecycle,
    private readonly channel: string,
    private readonly attempts: number,
  ) {}

  /** Before the handler is called with `fragment` (`attempt`: 1 for the first call). */
  delivering(fragment: FragmentHeaders, attempt: number): void {
    if (!this.lifecycle.events.listening) return;
    const { sequenceId } = fragment;
    if (!this.startedAt.has(sequenceId)) {
      if (this.startedAt.size >= REMEMBERED_STARTS) {
        this.startedAt.delete(this.startedAt.keys().next().value as string);
      }
      this.startedAt.set(sequenceId, Date.now());
    }
    // Once per sequence, not again when the handler is retried.
    if (fragment.position === 1 && attempt === 1) this.lifecycle.started(this.channel, fragment);
  }

  /** After the handler took `fragment` (`bytes`: the sequence's bytes streamed so far). */
  delivered(fragment: FragmentHeaders, bodyBytes: number, streamed: number, attempts: number) {
    if (!this.lifecycle.events.listening) return;
    this.lifecycle.fragmentAccepted(this.channel, fragment, bodyBytes);
    if (!fragment.last) return;
    const firstFragmentAt = this.startedAt.get(fragment.sequenceId) ?? Date.now();
    this.startedAt.delete(fragment.sequenceId);
    const { sequenceId, position } = fragment;
    const sequence = { sequenceId, fragments: position, bytes: streamed, firstFragmentAt };
    this.lifecycle.completed(this.channel, sequence, attempts);
  }

  /** After a handler call failed: `sequence.failed` when no retry follows. */
  handlerFailed(fragment: FragmentHeaders, error: unknown, attempt: number): void {
    if (!this.lifecycle.events.listening) return;
    if (!(error instanceof MessageRefusedError) && attempt < this.attempts) return;
    const subject = `sequence ${fragment.sequenceId} fragment ${fragment.position}`;
    const { code, detail } = handlerRejection(subject, { attempts: attempt, error });
    this.startedAt.delete(fragment.sequenceId);
    this.lifecycle.failed(this.channel, fragment.sequenceId, code, detail, attempt);
  }
}
