/** One dead letter, as an operator browses it. Nothing here removes it from its channel. */
export interface DeadLetter {
  /** Opaque, stable while the dead letter stays in its channel, unique within that channel. */
  readonly id: string;
  /** The channel the message was dead-lettered from, where a replay sends it back. */
  readonly channel: string;
  /** The dead-letter channel holding it (`<channel>.dlq` by default). */
  readonly deadLetterChannel: string;
  /** `x-death-reason`: the reason code and message (`integrity-mismatch: …`). */
  readonly reason: string;
  /** Every header as the transport holds it, `x-death-reason` included. */
  readonly headers: Readonly<Record<string, unknown>>;
  readonly bytes: number;
  /** When it was dead-lettered (ms since the epoch), where the transport knows. */
  readonly deadLetteredAt?: number;
  /** How many times an operator replayed it before (`x-replay-count`). */
  readonly replays: number;
}

export interface DeadLetterPage {
  /** Oldest first. */
  readonly items: readonly DeadLetter[];
  /** Dead letters in the channel, where the transport can count them cheaply. */
  readonly total?: number;
}

/** What an action did to the ids it was given: each id lands in exactly one list. */
export interface DeadLetterActionResult {
  /** Replayed (republished, confirmed, then removed) or discarded. */
  readonly done: readonly string[];
  /**
   * Maybe replayed while the dead letter stays in its channel: republished and confirmed but
   * removing it failed, or republished without a confirm (the broker may have stored it). Do not
   * replay these again before checking: the message may have been delivered once already.
   */
  readonly uncertain?: readonly { readonly id: string; readonly error: string }[];
  /** Not in the channel (any more): already replayed, discarded or expired. Nothing changed. */
  readonly missing: readonly string[];
  /** Tried and failed, with why; the dead letter stays where it was. */
  readonly failed: readonly { readonly id: string; readonly error: string }[];
}

/**
 * Browsing and acting on a transport's dead letters: what the operator console needs.
 * Optional: a transport that offers it returns one from `Transport.deadLetters()`.
 *
 * Contract:
 * - `browse` never removes a dead letter. Where the broker reads a queue only by taking from it
 *   (RabbitMQ), what a call took it puts back before it returns: such a dead letter is redelivered
 *   to a consumer of the dead-letter channel flagged `redelivered`, and on some queue types its
 *   place in the queue may change (each transport's documentation says).
 * - `replay` publishes each dead letter's body and headers to its original channel, minus
 *   `x-death-reason`, plus `x-replay-count` (previous count + 1) and `x-replayed-at`; only after
 *   the broker confirmed that publish is the dead letter removed. A crash in between can leave
 *   both (at-least-once), never neither.
 * - `replay` paces itself to `ratePerSecond`.
 * - `discard` removes for good.
 * - Ids not found are reported in `missing`, not thrown.
 * - `browse` reads at most {@link MAX_DEAD_LETTER_BROWSE} dead letters from the head of the
 *   dead-letter channel (fewer with a small `limit` and no `reason`), so `replay` and `discard`
 *   find ids among those: a dead letter deeper than that is reached once the ones ahead of it are
 *   gone. `limit` must be an integer from 1 to {@link MAX_DEAD_LETTER_BROWSE}.
 * - `reason` filters on the whole reason or on its code, the text before the first `:`, trimmed
 *   (`integrity-mismatch` matches `integrity-mismatch: crc32 of fragment 3 …` and a bare
 *   `integrity-mismatch `; `''` matches a dead letter without a reason): `reasonMatches`.
 * - A channel whose name the broker cannot hold (too long for a queue or stream name) has no
 *   dead letters: `count` and `browse` answer empty, `body` undefined, actions report `missing`,
 *   and nothing throws (the console takes channel names typed by hand).
 * - `ratePerSecond` is a positive number of replays per second (publishes, not ids: an id
 *   found missing takes no slot).
 */
export interface DeadLetterBox {
  /**
   * False where a browse reads by taking messages and putting them back (RabbitMQ): each read
   * disturbs the queue (redelivery flags, delivery counts, order on some queue types), so callers
   * browse on an operator's request only, never on a timer. True where reading takes nothing.
   */
  readonly browseIsNonDestructive: boolean;
  /**
   * How many dead letters `channel` holds, without reading any: the broker's own count
   * (undefined where the transport cannot count cheaply). 0 for a channel with none.
   */
  count(channel: string, at?: DeadLetterLocation): Promise<number | undefined>;
  browse(
    channel: string,
    options: { readonly limit: number; readonly reason?: string } & DeadLetterLocation,
  ): Promise<DeadLetterPage>;
  /** The body of one dead letter, or undefined when it is not there. */
  body(channel: string, id: string, at?: DeadLetterLocation): Promise<Buffer | undefined>;
  replay(
    channel: string,
    ids: readonly string[],
    options: { readonly ratePerSecond: number } & DeadLetterLocation,
  ): Promise<DeadLetterActionResult>;
  discard(
    channel: string,
    ids: readonly string[],
    at?: DeadLetterLocation,
  ): Promise<DeadLetterActionResult>;
}

/**
 * Where the dead letters of `channel` are, when not where the transport names them
 * (`transport.deadLetterChannel(channel)`): the `deadLetterChannel` its consumers were given.
 * A replay still goes back to `channel`.
 */
export interface DeadLetterLocation {
  readonly deadLetterChannel?: string;
}

/** Most dead letters one `browse` reads, and the most `limit` takes. */
export const MAX_DEAD_LETTER_BROWSE = 1_000;

/** Header a replay adds: how many times the message was replayed from a dead-letter channel. */
export const REPLAY_COUNT_HEADER = 'x-replay-count';
/** Header a replay adds: when (ms since the epoch). */
export const REPLAYED_AT_HEADER = 'x-replayed-at';
