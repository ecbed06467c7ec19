import type { Readable } from 'node:stream';
import type { TicketFragment } from '../core/claim-ticket';
import type { RejectionCode } from '../core/errors/rejection-code';
import type { HeaderMap, HeaderValue } from '../core/headers';
import type { SequencePayload } from '../core/payload-source';
import type { ResequencerDefinition } from '../options/resequencer.options';
import type { DeadLetterListener, KeyRetirement } from '../options/resolved-options';
import type { SequenceConsumerOptions } from '../options/sequence.options';
import type { Disposition, InboundMessage } from '../ports/transport.port';
import type { HandlerContext } from './handler-call';

// What a pattern offers the others. Patterns never import each other: where one builds on
// another (Claim Check's `mode: 'auto'` sends and reassembles Message Sequences, Message
// Sequence parks fragment bodies in Claim Check's payload store, and its stream mode orders
// fragments with the Resequencer), it injects the other's capability by the token below, and the
// module binds each token to the pattern that provides it.

/**
 * Message Sequence's sending side: what `SplitterService` offers. `buffer: 'store'` sends to the
 * channel itself whatever the module's `sequence.buffer` (a consumer that reassembles from the
 * channel, not from its partitions).
 */
export interface SequenceSender {
  send(
    channel: string,
    payload: SequencePayload,
    options: { headers?: HeaderMap; contentType?: string; buffer?: 'store' },
    /** Stops the send once aborted (see `SplitterService.send`). */
    signal?: AbortSignal,
  ): Promise<{ sequenceId: string; fragments: number; bytes: number; sha256: string }>;
  /**
   * Whether `send` takes a payload of `payloadBytes` with these headers: every fragment message
   * within the transport's limit, and the sequence within the module's own consumer limits.
   */
  fits(payloadBytes: number, options: { headers?: HeaderMap; contentType?: string }): boolean;
}
export const SEQUENCE_SENDER = Symbol('nest-sequence:sequence-sender');

/** A reassembled, verified sequence, as a handler of another pattern receives it. */
export interface ReassembledSequence {
  readonly sequenceId: string;
  readonly fragments: number;
  readonly bytes: number;
  readonly sha256: string;
  readonly contentType?: string;
  readonly headers: Readonly<HeaderMap>;
  /** The payload, verified as it is read. */
  stream(): Readable;
}

/** A channel's sequences bound to a handler (what {@link SequenceReassembler.createConsumer} made). */
export interface ReassemblyConsumer {
  readonly channel: string;
}

/** Message Sequence's receiving side: what `AggregatorService` offers. */
export interface SequenceReassembler {
  /** Binds `handler` to `channel`'s sequences, with the consumer's options over the module's. */
  createConsumer(
    channel: string,
    handler: (payload: ReassembledSequence, context: HandlerContext) => unknown,
    options: SequenceConsumerOptions,
  ): ReassemblyConsumer;
  /** Takes one fragment message of the consumer's channel; never throws. */
  receive(message: InboundMessage, consumer: ReassemblyConsumer): Promise<Disposition>;
}
export const SEQUENCE_REASSEMBLER = Symbol('nest-sequence:sequence-reassembler');

/** A fragment body parked in the payload store: its message carries `ticketBody` instead. */
export interface ParkedFragment {
  readonly ticketBody: Buffer;
}

/** The bytes behind a parked fragment's ticket, checked against it. */
export interface TakenFragment {
  readonly body: Buffer;
  /** The fragment is stored elsewhere now: lets the parked copy go (per retention). Never throws. */
  release(): Promise<void>;
}

/** Claim Check's parking, as Message Sequence sends fragments `via: 'claim-check'`. */
export interface FragmentParking {
  /**
   * Parks a fragment body under a ticket that only `channel`'s consumers take, and only as
   * `fragment` (its sequence id and position).
   */
  park(body: Buffer, channel: string, fragment: TicketFragment): Promise<ParkedFragment>;
  /** After the ticket's publish: keeps the parked body (it may be delivered) or deletes it. Never throws. */
  settle(parked: ParkedFragment, published: boolean): Promise<void>;
  /**
   * The body behind a ticket message taken on `channel` as `fragment` (what its headers name), or
   * why it is refused for good (a bad ticket, one issued for another channel or fragment, an
   * unknown store, bytes that do not match, a body over `maxBytes`). `expiredOnly`: the ticket passes every check but its expiry, so the
   * message may be a late copy of a fragment taken before.
   * @throws when the payload store cannot be read now (the message is redelivered later)
   */
  take(
    ticketBody: Buffer,
    channel: string,
    fragment: TicketFragment,
    maxBytes: number,
  ): Promise<
    | TakenFragment
    | { readonly refused: RejectionCode; readonly detail: string; readonly expiredOnly?: true }
  >;
}
export const FRAGMENT_PARKING = Symbol('nest-sequence:fragment-parking');

/** A released event, as an ordered intake hands it over. */
export interface OrderedEvent {
  readonly key: string;
  readonly seq: number;
  readonly body: Buffer;
  readonly headers: Readonly<Record<string, HeaderValue>>;
}

/** The Resequencer, as Message Sequence's stream mode orders a sequence's fragments with it. */
export interface OrderedIntake {
  /**
   * A resequencer that the caller feeds (its channel's subscription is the caller's); the gap
   * sweeper covers it. @throws SequenceOptionsError naming `definedBy`
   */
  defineIntake(
    definedBy: string,
    definition: ResequencerDefinition,
    handler: (event: OrderedEvent, context: HandlerContext) => unknown,
    bounds?: IntakeBounds,
  ): { receive(message: InboundMessage): Promise<Disposition> };
}

/**
 * What an intake's definer sets besides the definition (stream mode: its own budget, keys that
 * end, and the dead letters its handler never sees).
 */
export interface IntakeBounds {
  /** In place of `resequencer.maxBufferedBytesTotal`. */
  readonly maxBufferedBytesTotal?: number;
  /**
   * Once a gap's events are dead-lettered (its timeout, or retention near), the key is closed:
   * every later event of it is dead-lettered with this code instead of released (stream mode: a
   * sequence that lost a fragment never reaches its end).
   */
  readonly closeAfterDeadLetter?: RejectionCode;
  /**
   * Keys that come to an end (stream mode: a sequence, at its last fragment). Once a drain has
   * handed over (delivered or dead-lettered) an event `ends` says true of, or the events
   * dead-lettered when the key closed (`closeAfterDeadLetter`), and left the key holding nothing,
   * the key's state (which drops repeats of its events) is kept `afterMs` more rather than the
   * store's retention (`ResequencerStore.retire`).
   */
  readonly retire?: KeyRetirement;
  /**
   * Told of each event of a key the resequencer dead-letters itself, which the handler never
   * sees (a gap's, one refused after its key closed, one that does not decrypt), once its dead
   * letter is sent (or, for an input refused, decided); never of the handler's own failures.
   */
  readonly deadLettered?: DeadLetterListener;
  /**
   * Told of each event the handler refused (threw `MessageRefusedError`), once its dead letter is
   * sent: a refusal whose dead letter could not be sent comes back, and is told of only then.
   */
  readonly refused?: DeadLetterListener;
}
export const ORDERED_INTAKE = Symbol('nest-sequence:ordered-intake');
