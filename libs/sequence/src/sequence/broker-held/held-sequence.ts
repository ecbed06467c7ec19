import { createHash, type Hash } from 'node:crypto';
import type { Readable } from 'node:stream';
import {
  emptySequenceState,
  isComplete,
  missingPositions,
  type SequenceState,
} from '../../core/completeness';
import type { FragmentHeaders, HeaderMap } from '../../core/headers';
import type { CompleteSequence, ExpiredSequence } from '../../ports/sequence-store.port';
import type { Disposition } from '../../ports/transport.port';
import type { CheckedRange, SpoolFile, SpoolRange } from './spool';
import { asError } from '../../core/errors/caught';

/** One fragment held unsettled in the broker, its body in the spool (checked as it is read back). */
export interface HeldFragment extends CheckedRange {
  /** The message's headers, to hand it to the store path should the sequence go there. */
  readonly headers: Readonly<Record<string, unknown>>;
  readonly redelivered: boolean;
  /** Settles the message: the transport acts on it once called. */
  readonly settle: (disposition: Disposition) => void;
  /** Aborted once the transport can no longer settle it (`InboundMessage.abandoned`). */
  readonly abandoned?: AbortSignal;
  /**
   * The transport no longer holds the body (`InboundMessage.releaseBody`, once it was spooled):
   * to forward it, the body must come from the spool, or the broker must deliver it again.
   */
  released: boolean;
  /** Releases the body in the transport (`InboundMessage.releaseBody`), where it offers that. */
  readonly releaseBody?: () => void;
  /**
   * The body itself, kept until the spool has it: a write that failed leaves a hole in the file,
   * and the sequence then goes to the store with this body instead of what the hole reads as.
   */
  body?: Buffer;
}

/**
 * A sequence whose fragments this consumer holds unacknowledged in the broker: what the
 * admission rules need (core/completeness), where each body lies in its spool file, and the
 * SHA-256 of the payload as far as it arrived in order.
 */
export class HeldSequence {
  readonly state: SequenceState;
  readonly fragments = new Map<number, HeldFragment>();
  /** `holding` until complete; then `delivering`; `done` once every fragment is settled. */
  phase: 'holding' | 'delivering' | 'done' = 'holding';
  /** Being moved to the store (`delivering` too): its fragments are settled one by one. */
  spilling = false;
  /** Bytes reserved in the spool for this sequence. */
  spooled = 0;
  /** Whether its start was reported: once a first fragment of it was admitted. */
  started = false;
  userHeaders: HeaderMap = {};
  timer?: NodeJS.Timeout;
  /** The `abandoned` signals of its fragments' deliveries that the reassembler watches for it. */
  readonly watchedSignals = new Set<AbortSignal>();
  private readonly writes = new Set<Promise<boolean>>();
  private writeFailure?: Error;
  private readonly hash: Hash = createHash('sha256');
  /** The next position the running hash takes; 0 once a fragment came out of order. */
  private nextHashed = 1;

  constructor(
    readonly channel: string,
    readonly sequenceId: string,
    readonly partition: number,
    readonly file: SpoolFile,
    now: number,
  ) {
    this.state = emptySequenceState(now);
  }

  /**
   * Takes the first fragment's user headers (its content type and encoding are the first any
   * fragment carries, which `recordFragment` keeps in `state`, as the stores do).
   */
  describe(fragment: FragmentHeaders): void {
    if (this.fragments.size === 0) this.userHeaders = fragment.userHeaders;
  }

  /**
   * Writes a new fragment's body at the end of the file; feeds the running hash when in order.
   * `written` resolves true once the file holds it, false if the write failed.
   */
  spool(position: number, body: Buffer): SpoolRange & { written: Promise<boolean> } {
    const range = { offset: this.spooled, length: body.length };
    this.spooled += body.length;
    if (position === this.nextHashed) {
      this.hash.update(body);
      this.nextHashed++;
    } else {
      this.nextHashed = 0;
    }
    const writing = this.file.write(body, range.offset).then(
      () => true,
      (error: unknown) => {
        this.writeFailure ??= asError(error);
        return false;
      },
    );
    this.writes.add(writing);
    void writing.finally(() => this.writes.delete(writing));
    return { ...range, written: writing };
  }

  /** Waits for every write; rejects with the first that failed. */
  async written(): Promise<void> {
    await Promise.all([...this.writes]);
    if (this.writeFailure !== undefined) throw this.writeFailure;
  }

  get complete(): boolean {
    return isComplete(this.state);
  }

  /** The payload's digest when every fragment came in order (else it must be read back). */
  inOrderDigest(): { sha256: string; bytes: number } | undefined {
    if (this.nextHashed === 0 || !this.complete) return undefined;
    return { sha256: this.hash.digest('hex'), bytes: this.state.storedBytes };
  }

  /** The bodies' places in the spool, in position order. */
  ranges(): CheckedRange[] {
    return [...this.fragments.values()].sort((a, b) => a.position - b.position);
  }

  /** The payload read back from the spool, each body checked against its CRC-32. */
  read(): Readable {
    return this.file.read(this.ranges(), this.sequenceId);
  }

  /** What a handler is told of the complete sequence. */
  toComplete(): CompleteSequence {
    return {
      scope: this.channel,
      sequenceId: this.sequenceId,
      fragments: this.state.size ?? this.fragments.size,
      bytes: this.state.storedBytes,
      sha256: this.state.sha256,
      declaredBytes: this.state.declaredBytes,
      contentType: this.state.contentType,
      contentEncoding: this.state.contentEncoding,
      userHeaders: this.userHeaders,
      firstFragmentAt: this.state.firstFragmentAt,
      lastFragmentAt: this.state.lastFragmentAt,
    };
  }

  /** What `onExpired` and the expiry event are told. */
  toExpired(now: number): ExpiredSequence {
    const received = [...this.fragments.keys()].sort((a, b) => a - b);
    return {
      scope: this.channel,
      sequenceId: this.sequenceId,
      receivedPositions: received,
      missingPositions: missingPositions(received, this.state.size),
      size: this.state.size,
      bufferedBytes: this.state.storedBytes,
      firstFragmentAt: this.state.firstFragmentAt,
      lastFragmentAt: this.state.lastFragmentAt,
      ageMs: now - this.state.firstFragmentAt,
    };
  }

  /**
   * Settles every held fragment the same way, once; returns how many there were. A fragment whose
   * body was released cannot be forwarded by the transport: instead of a `dead-letter` or delayed
   * `requeue` it goes back to its queue, and comes again whole (to meet the marker's verdict). The
   * requeue names what it stands for, so that a transport that cannot deliver it again (at its
   * last allowed delivery) dead-letters it with that reason in its own.
   */
  settleAll(disposition: Disposition): number {
    const count = this.fragments.size;
    for (const fragment of this.fragments.values()) {
      const forwards =
        disposition.action !== 'ack' && !(disposition.action === 'requeue' && !disposition.delayMs);
      fragment.settle(
        fragment.released && forwards
          ? { action: 'requeue', reason: returnedFor(disposition) }
          : disposition,
      );
    }
    this.fragments.clear();
    this.phase = 'done';
    clearTimeout(this.timer);
    return count;
  }
}

/** What a requeue in place of `disposition` says: `returned for dead-letter: <its reason>`. */
function returnedFor(disposition: Disposition): string {
  const reason = disposition.action === 'ack' ? undefined : disposition.reason;
  return `returned for ${disposition.action}${reason ? `: ${reason}` : ''}`;
}
