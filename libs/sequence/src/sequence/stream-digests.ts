import { createHash, type Hash } from 'node:crypto';

interface Running {
  readonly hash: Hash;
  /** The next position this hash expects. */
  next: number;
  bytes: number;
  /**
   * The last fragment that failed the check, as it declared itself: when it comes back (its dead
   * letter could not be sent) it meets the same verdict, counted once.
   */
  rejected?: { readonly position: number; readonly sha256?: string };
  spoiled?: boolean;
}

/** The whole-payload check of a streamed sequence, when this instance saw all of it. */
export type StreamCheck =
  | { readonly kind: 'matched' }
  | { readonly kind: 'unverifiable' }
  | { readonly kind: 'mismatch'; readonly sha256: string; readonly bytes: number };

/**
 * SHA-256 of streamed sequences, fed fragment by fragment as they are delivered in order. A
 * sequence is checkable only if this process delivered every fragment from position 1; a hole
 * (another instance delivered a fragment, a restart, an eviction) makes it unverifiable, which
 * is reported, not failed. At most `capacity` sequences are followed (least recently fed
 * evicted), so memory stays bounded whatever the number of open streams.
 */
export class StreamDigests {
  private readonly running = new Map<string, Running>();

  constructor(private readonly capacity: number) {}

  /** Feeds fragment `position`; a repeat (a handler retry) is ignored. */
  feed(sequenceId: string, position: number, body: Buffer): void {
    let state = this.running.get(sequenceId);
    // A first fragment after a rejected sequence begins another one under the same id.
    if (position === 1 && (!state || state.next !== 2 || state.rejected)) {
      state = { hash: createHash('sha256'), next: 1, bytes: 0 };
    }
    if (!state) return;
    this.running.delete(sequenceId); // re-inserted last: Map order is recency
    if (position === state.next) {
      state.hash.update(body);
      state.bytes += body.length;
      state.next++;
    } else if (position !== state.next - 1) {
      return; // a hole: this process cannot check the sequence
    }
    this.running.set(sequenceId, state);
    if (this.running.size > this.capacity) {
      this.running.delete(this.running.keys().next().value as string);
    }
  }

  /** Bytes fed so far of a sequence this process follows from its first fragment. */
  bytesOf(sequenceId: string): number | undefined {
    return this.running.get(sequenceId)?.bytes;
  }

  /** After feeding the last fragment: does the payload match what the producer declared? */
  check(
    sequenceId: string,
    lastPosition: number,
    declared: { sha256?: string; bytes?: number },
  ): StreamCheck {
    const state = this.running.get(sequenceId);
    const { rejected } = state ?? {};
    if (rejected && (rejected.position !== lastPosition || rejected.sha256 !== declared.sha256)) {
      // Not the rejected fragment back: another sequence under the same id, of which this
      // process saw only the end.
      this.running.delete(sequenceId);
      return { kind: 'unverifiable' };
    }
    if (
      !state ||
      state.spoiled ||
      state.next !== lastPosition + 1 ||
      declared.sha256 === undefined
    ) {
      return { kind: 'unverifiable' };
    }
    const sha256 = state.hash.copy().digest('hex');
    const bytesMatch = declared.bytes === undefined || declared.bytes === state.bytes;
    return sha256 === declared.sha256 && bytesMatch
      ? { kind: 'matched' }
      : { kind: 'mismatch', sha256, bytes: state.bytes };
  }

  /** Marks a sequence whose last fragment failed the check; true the first time. */
  markRejected(sequenceId: string, position: number, sha256: string | undefined): boolean {
    const state = this.running.get(sequenceId);
    if (!state || state.rejected) return false;
    state.rejected = { position, sha256 };
    return true;
  }

  /** Keeps counting the sequence's bytes, but it can no longer be verified. */
  spoil(sequenceId: string): void {
    const state = this.running.get(sequenceId);
    if (state) state.spoiled = true;
  }

  forget(sequenceId: string): void {
    this.running.delete(sequenceId);
  }
}
