import { Logger } from '@nestjs/common';
import { crc32 } from '../core/checksum';
import { userHeadersRefusal } from '../core/completeness';
import { MalformedFragmentError } from '../core/errors/malformed-fragment.error';
import { deathReason, type RejectionCode } from '../core/errors/rejection-code';
import { SequenceIntegrityError } from '../core/errors/sequence-integrity.error';
import { StoredFragmentIntegrityError } from '../core/errors/stored-fragment-integrity.error';
import {
  isLastFragment,
  parseFragmentHeaders,
  SequenceHeader,
  type FragmentHeaders,
  type HeaderValue,
} from '../core/headers';
import type { SequenceMetrics } from './sequence.metrics';
import type { Disposition, InboundMessage } from '../ports/transport.port';
import type { HandlerContext } from '../kernel/handler-call';
import type { OrderedEvent, OrderedIntake } from '../kernel/pattern-contracts';
import type { ResolvedSequenceConsumer } from '../options/resolved-options';
import { claimCheckMarking } from '../core/claim-check-headers';
import { errorMessage } from '../core/errors/caught';
import { rememberRecent, rememberRecentEntry } from '../core/objects';
import { MessageRefusedError } from '../core/errors/message-refused.error';
import { StreamDigests } from './stream-digests';
import { StreamedFragment } from './streamed-fragment';
import type { FragmentIds, SequenceLifecycle } from './sequence.events';
import { StreamLifecycle } from './stream.events';

/** A function that receives a streamed sequence's fragments, in order. */
export type FragmentHandlerFn = (fragment: StreamedFragment, context: HandlerContext) => unknown;

/** Sequences whose SHA-256 one consumer follows at once (each holds a hash state, ~200 bytes). */
const FOLLOWED_SEQUENCES = 4096;

/**
 * `@SequencedHandler({ mode: 'stream' })`: a Message Sequence consumer built on the Resequencer.
 * Each fragment is checked (wire contract, CRC-32) and handed to a resequencer whose key is the
 * sequence id and whose sequence is the position: the handler receives each sequence's fragments
 * in position order as soon as they are contiguous, once, whichever instance took them — with
 * the Resequencer's guarantees (atomic release, one drainer per sequence, durable hand-off).
 *
 * Differences from reassembly: nothing waits for the whole payload, so the SHA-256 can only be
 * checked as the fragments go by; the instance that delivers the last fragment checks it when it
 * delivered every fragment itself (else `verified: false`), and never hands over a last fragment
 * that fails it. A fragment missing past `timeout.ms` lets the gap policy `'dead-letter'` move the
 * fragments buffered behind it to the dead-letter channel; the handler never sees `last`.
 */
export class FragmentStream {
  private readonly logger = new Logger('SequenceModule');
  private readonly digests = new StreamDigests(FOLLOWED_SEQUENCES);
  /**
   * Sequences this process handed over to the end: their last position, so that a fragment
   * claiming to come after it is refused rather than appended past the end, until their
   * resequencer key expires (`retentionMs` after the store let it go; after that, the id starts
   * a new sequence; never, while the store keeps the key for its own retention); the most recent
   * FOLLOWED_SEQUENCES, oldest forgotten first.
   */
  private readonly ended = new Map<string, { readonly last: number; readonly until: number }>();
  /** Sequences reported `sequence-too-large` here (the most recent ones). */
  private readonly tooLarge = new Set<string>();
  /** Sequences counted expired here: a fragment missing past timeoutMs (the most recent ones). */
  private readonly expired = new Set<string>();
  /** Fragments reported changed in the store (sequence id and position; the most recent ones). */
  private readonly changedInStore = new Set<string>();
  private readonly intake: { receive(message: InboundMessage): Promise<Disposition> };
  private readonly events: StreamLifecycle;

  constructor(
    readonly channel: string,
    private readonly options: ResolvedSequenceConsumer,
    private readonly handler: FragmentHandlerFn,
    private readonly metrics: SequenceMetrics,
    ordering: OrderedIntake,
    definedBy: string,
    /** What the channel's buffered fragments may hold in all: its sequence budget. */
    channelBudgetBytes: number,
    private readonly lifecycle: SequenceLifecycle,
    /**
     * `sequence.retentionMs`: how long the state of a sequence that ended is kept (its key in the
     * resequencer store), as a completion marker is in reassembly.
     */
    retentionMs: number,
  ) {
    this.events = new StreamLifecycle(lifecycle, metrics, channel, options.handlerRetry.attempts);
    // The consumer host subscribes for the @SequencedHandler, through `receive`.
    this.intake = ordering.defineIntake(
      definedBy,
      {
        channel,
        name: `sequence-stream:${channel}`,
        key: SequenceHeader.id,
        seq: SequenceHeader.position,
        gap: { timeoutMs: options.timeout.ms, policy: 'dead-letter' },
        handlerRetry: options.handlerRetry,
        handlerTimeoutMs: options.handlerTimeoutMs ?? false,
        prefetch: options.prefetch,
        deadLetterChannel: options.deadLetterChannel,
        // Fragments ahead of a missing one wait in the broker, whatever the module's
        // resequencer.overflow says for @Resequenced handlers: one dead-lettered here would leave
        // a hole no expiry comes for.
        overflow: 'backpressure',
        maxBufferedPerKey: options.maxFragments,
        maxBufferedBytesPerKey: options.maxSequenceBytes,
      },
      (event, context) => this.deliver(event, context),
      {
        maxBufferedBytesTotal: channelBudgetBytes,
        // A sequence that lost a fragment never reaches its end: its later fragments are
        // dead-lettered too, on whichever instance takes them.
        closeAfterDeadLetter: 'sequence-expired',
        // A sequence that ended keeps its key (which drops late copies of its fragments) for
        // retentionMs, not for the store's retention: the store holds what is open, not history.
        retire: {
          afterMs: retentionMs,
          ends: (key, entry) => this.ends(key, entry.headers),
          retired: (key, until) => this.keyRetired(key, until),
        },
        // The fragments the resequencer dead-letters itself (those behind a lost one, those
        // that come after the sequence closed) are reported as any refused fragment is.
        deadLettered: (sequenceId, position, code, detail) => {
          if (code === 'resequencer-gap-dead-letter') this.expiredOnce(sequenceId);
          this.rejected(code, detail, { sequenceId, position });
        },
        // Of the fragments `deliver` refuses, those past maxSequenceBytes are reported once their
        // dead letter is sent (one that could not be sent comes back: reported once still); the
        // others `deliver` reports itself.
        refused: (sequenceId, position, code, detail) => {
          if (code === 'sequence-too-large') this.rejected(code, detail, { sequenceId, position });
        },
      },
    );
  }

  /**
   * Whether a fragment of `sequenceId` handed over (delivered or dead-lettered) ends its
   * sequence: the last one, or one behind the end this process handed over.
   */
  private ends(sequenceId: string, headers: Readonly<Record<string, HeaderValue>>): boolean {
    return this.ended.has(sequenceId) || isLastFragment(headers);
  }

  /** Takes one fragment message; never throws. */
  async receive(message: InboundMessage): Promise<Disposition> {
    const body: unknown = message.body;
    const headers = message.headers ?? {};
    if (!Buffer.isBuffer(body))
      return this.reject('malformed-header', 'the message body is not binary');
    const marking = claimCheckMarking(headers);
    if (marking.via === 'unrecognised') return this.reject('malformed-header', marking.problem);
    if (marking.via === 'ticket') {
      return this.reject(
        'malformed-header',
        "a fragment sent via claim check reached a mode: 'stream' handler, which takes fragments inline only",
      );
    }
    this.metrics.fragmentReceived(this.channel, body.length);
    if (body.length > this.options.maxFragmentBytes) {
      return this.reject(
        'fragment-too-large',
        `${body.length}-byte body exceeds maxFragmentBytes (${this.options.maxFragmentBytes})`,
      );
    }
    let fragment: FragmentHeaders;
    try {
      fragment = parseFragmentHeaders(headers);
    } catch (error) {
      const code = error instanceof MalformedFragmentError ? error.code : 'malformed-header';
      return this.reject(code, errorMessage(error));
    }
    const pastEnd = this.pastEnd(fragment);
    if (pastEnd) return this.reject('position-out-of-range', pastEnd, fragment);
    const headersRefused = userHeadersRefusal(fragment.userHeaders, this.options.maxHeaderBytes);
    if (headersRefused) {
      return this.reject(
        headersRefused.code,
        `sequence ${fragment.sequenceId} fragment ${fragment.position}: ${headersRefused.detail}`,
        fragment,
      );
    }
    if (fragment.bytes !== undefined && fragment.bytes > this.options.maxSequenceBytes) {
      return this.reject(
        'sequence-too-large',
        `sequence ${fragment.sequenceId} declares ${fragment.bytes} bytes, over maxSequenceBytes (${this.options.maxSequenceBytes})`,
        fragment,
      );
    }
    // Declared or received, as reassembly counts them: a sequence that declares more is refused
    // from its first fragment, before its handler gets any part of it.
    const fragments = Math.max(fragment.size ?? 0, fragment.position);
    if (fragments > this.options.maxFragments) {
      const counted =
        fragments === fragment.position ? `position ${fragments}` : `declared size ${fragments}`;
      const detail =
        `sequence ${fragment.sequenceId} fragment ${fragment.position}: ${counted} is beyond ` +
        `maxFragments (${this.options.maxFragments})`;
      this.rejectOnce(fragment.sequenceId, 'too-many-fragments', detail);
      return this.reject('too-many-fragments', detail, fragment);
    }
    const bodyCrc = crc32(body);
    if (bodyCrc !== fragment.crc32) {
      return this.reject(
        'crc-mismatch',
        `sequence ${fragment.sequenceId} fragment ${fragment.position}: body CRC-32 is ${bodyCrc}, header says ${fragment.crc32}`,
        fragment,
      );
    }
    return this.intake.receive(message);
  }

  /** Hands one released fragment to the handler; a last fragment only if the payload checks. */
  private async deliver(event: OrderedEvent, context: HandlerContext): Promise<void> {
    const fragment = parseFragmentHeaders(event.headers);
    const { sequenceId, position } = fragment;
    // Released behind the last fragment (it was buffered before the last came): never handed over.
    const pastEnd = this.pastEnd(fragment);
    if (pastEnd) {
      // The sequence itself ended (completed, or refused at its last fragment): only this
      // fragment is refused, as one arriving after the last is.
      this.rejected('position-out-of-range', pastEnd, fragment);
      throw new MessageRefusedError('position-out-of-range', pastEnd);
    }
    // Checked again as it leaves the resequencer's store (Redis keeps bodies as base64 in JSON): a
    // body changed there must not reach the handler as the one checked at intake.
    const storedCrc = crc32(event.body);
    if (storedCrc !== fragment.crc32) {
      const error = new StoredFragmentIntegrityError(
        sequenceId,
        position,
        fragment.crc32,
        storedCrc,
      );
      // Reported once: a fragment whose dead letter could not be sent comes back.
      const changed = `${sequenceId}\u0000${position}`;
      if (!this.changedInStore.has(changed)) {
        rememberRecent(this.changedInStore, changed, FOLLOWED_SEQUENCES);
        this.rejected('integrity-mismatch', error.message, fragment);
      }
      // Final: the deliverer dead-letters it without calling the handler again.
      throw error;
    }
    this.digests.feed(sequenceId, position, event.body);
    const streamed = this.digests.bytesOf(sequenceId);
    if (streamed !== undefined && streamed > this.options.maxSequenceBytes) {
      const detail =
        `sequence ${sequenceId} fragment ${position}: ${streamed} bytes streamed pass ` +
        `maxSequenceBytes (${this.options.maxSequenceBytes})`;
      this.rejectOnce(sequenceId, 'sequence-too-large', detail);
      // Final: the deliverer dead-letters this fragment without retrying the handler, then
      // reports it (`refused`), as reassembly reports each fragment it refuses past the limit.
      throw new MessageRefusedError('sequence-too-large', detail);
    }
    let verified: boolean | undefined;
    if (fragment.last) {
      const check = this.digests.check(sequenceId, position, fragment);
      if (check.kind === 'mismatch') {
        // The digest is kept: when the dead letter cannot be sent, the fragment comes back from
        // the hand-off list, and must meet the same mismatch rather than an unverifiable check.
        if (this.digests.markRejected(sequenceId, position, fragment.sha256)) {
          this.metrics.sequenceRejected(this.channel, 'integrity-mismatch');
          const error = new SequenceIntegrityError(sequenceId, fragment, check);
          this.lifecycle.rejected(this.channel, sequenceId, 'integrity-mismatch', error.message);
        }
        // Its end: no other last, nor any fragment past it, is handed over after this one.
        this.markEnded(sequenceId, position);
        // Final: the deliverer dead-letters this fragment without retrying the handler.
        throw new SequenceIntegrityError(sequenceId, fragment, check);
      }
      verified = check.kind === 'matched';
      if (!verified) {
        this.logger.warn(
          `${this.channel}: sequence ${sequenceId} streamed through several instances; its ` +
            'SHA-256 could not be checked here (delivered with verified: false)',
        );
      }
    }
    this.events.delivering(fragment, context.attempt);
    // Past handlerTimeoutMs the call is abandoned, not failed: the deliverer retries or
    // dead-letters the fragment now, so its events go now too, and none when the call returns.
    const failed = (error: unknown) => {
      this.events.handlerFailed(fragment, error, context.attempt);
      // Dead-lettered, not handled: the handler did not take every byte, so the SHA-256 of what
      // it took cannot vouch for the payload (its last fragment goes with verified: false).
      const final =
        error instanceof MessageRefusedError ||
        context.attempt >= this.options.handlerRetry.attempts;
      if (final) {
        this.digests.spoil(sequenceId);
        // Its last fragment dead-lettered: the sequence ended here all the same.
        if (fragment.last) this.markEnded(sequenceId, position);
      }
    };
    const abandoned = () => failed(context.signal.reason);
    context.signal.addEventListener('abort', abandoned, { once: true });
    // Called inside the try: a handler that throws at once fails as one that rejects.
    const call = () =>
      this.handler(
        new StreamedFragment(
          sequenceId,
          position,
          fragment.last,
          event.body,
          fragment.userHeaders,
          fragment.size,
          fragment.bytes,
          fragment.contentType,
          verified,
        ),
        context,
      );
    try {
      await call();
    } catch (error) {
      if (!context.signal.aborted) failed(error);
      throw error;
    } finally {
      context.signal.removeEventListener('abort', abandoned);
    }
    if (context.signal.aborted) return;
    // Not followed from fragment 1 here (another instance, a restart): what the last declares.
    const bytes = streamed ?? fragment.bytes ?? 0;
    this.events.delivered(fragment, event.body.length, bytes, context.attempt);
    if (fragment.last) {
      this.digests.forget(sequenceId);
      this.markEnded(sequenceId, position);
    }
  }

  /** Notes where `sequenceId` ended, for {@link pastEnd}; the oldest are forgotten first. */
  private markEnded(sequenceId: string, position: number): void {
    // Until its key is let go (keyRetired), late copies keep coming to it.
    rememberRecentEntry(
      this.ended,
      sequenceId,
      { last: position, until: Infinity },
      FOLLOWED_SEQUENCES,
    );
  }

  /** The store let the key of `sequenceId` go: it expires at `until`, and the id is free then. */
  private keyRetired(sequenceId: string, until: number): void {
    const ended = this.ended.get(sequenceId);
    if (ended) this.ended.set(sequenceId, { last: ended.last, until });
  }

  /**
   * Why a fragment of a sequence this process handed over to the end cannot belong to it (a
   * position past the last, or another last), if it cannot. A repeat of a delivered one passes:
   * the resequencer drops it as a duplicate.
   */
  private pastEnd(fragment: FragmentHeaders): string | undefined {
    const ended = this.ended.get(fragment.sequenceId);
    if (ended === undefined) return undefined;
    if (Date.now() >= ended.until) {
      // Its key is retired: this fragment starts a new sequence under the id.
      this.ended.delete(fragment.sequenceId);
      return undefined;
    }
    const { last } = ended;
    if (fragment.position > last || (fragment.last && fragment.position !== last)) {
      return (
        `sequence ${fragment.sequenceId} fragment ${fragment.position}: the sequence ended ` +
        `at fragment ${last}, handed over already`
      );
    }
    return undefined;
  }

  /**
   * Reports the sequence rejected, once: for the fragment that crossed a limit (not each one after
   * it, nor that one again when its dead letter could not be sent and it comes back).
   */
  private rejectOnce(
    sequenceId: string,
    code: 'sequence-too-large' | 'too-many-fragments',
    detail: string,
  ): void {
    if (this.tooLarge.has(sequenceId)) return;
    rememberRecent(this.tooLarge, sequenceId, FOLLOWED_SEQUENCES);
    this.metrics.sequenceRejected(this.channel, code);
    this.lifecycle.rejected(this.channel, sequenceId, code, detail);
  }

  /**
   * Counts the sequence expired (`sequences_expired_total`), once: the first of the fragments
   * behind its missing one that the resequencer moves out past timeoutMs.
   */
  private expiredOnce(sequenceId: string): void {
    if (this.expired.has(sequenceId)) return;
    rememberRecent(this.expired, sequenceId, FOLLOWED_SEQUENCES);
    this.metrics.sequenceExpired(this.channel);
  }

  private reject(code: RejectionCode, detail: string, fragment?: FragmentIds): Disposition {
    this.rejected(code, detail, fragment);
    const reason = deathReason(code, detail);
    this.logger.warn(`${this.channel}: dead-lettered a fragment: ${reason}`);
    return { action: 'dead-letter', reason };
  }

  /** A fragment refused: counted (`fragments_rejected_total`) and reported (`fragment.rejected`). */
  private rejected(code: RejectionCode, detail: string, fragment?: FragmentIds): void {
    this.metrics.fragmentRejected(this.channel, code);
    this.lifecycle.fragmentRejected(this.channel, code, detail, fragment);
  }
}
