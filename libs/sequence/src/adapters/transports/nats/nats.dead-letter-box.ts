import {
  JetStreamApiError,
  type JetStreamManager,
  type MsgRequest,
  type StoredMsg,
} from '@nats-io/jetstream';
import { errorMessage } from '../../../core/errors/caught';
import { PublishTimeoutError } from '../../../core/errors/publish-timeout.error';
import type { HeaderMap } from '../../../core/headers';
import {
  actOnEach,
  browseLimit,
  deathReasonOf,
  Pacer,
  reasonMatches,
  replayHeaders,
  replaysOf,
  unconfirmedReplay,
} from '../../../ports/dead-letter-actions';
import {
  MAX_DEAD_LETTER_BROWSE,
  type DeadLetter,
  type DeadLetterActionResult,
  type DeadLetterBox,
  type DeadLetterLocation,
  type DeadLetterPage,
} from '../../../ports/dead-letter-box.port';
import { headerBytes } from '../../../ports/transport.port';
import { forwardMsgId, storedKey } from './nats.acks';
import { readHeaders, unreadableHeadersReason } from './nats.headers';

/** What the box needs of the NATS transport. */
export interface NatsDeadLetterAccess {
  jsm(): Promise<JetStreamManager>;
  /** The stream holding `channel`'s messages. */
  stream(channel: string): string;
  deadLetterChannel(channel: string): string;
  /** The transport's publish with a `Nats-Msg-Id` of the caller's, resolving on the PubAck. */
  publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    msgId: string,
  ): Promise<{ readonly duplicate: boolean }>;
}

/** JetStream API error: the stream does not exist. */
const STREAM_NOT_FOUND = 10059;
/**
 * Whether a message delete's error says there was nothing to delete: the stream is gone, or the
 * message is. JetStream answers a delete of a missing message with error code 10057 (or 10037,
 * 10043 on some versions) and "no message found"; the same 10057 also answers a delete the
 * stream refuses (`deny_delete`: "message delete not permitted"), so the description decides.
 */
export function deleteFoundNothing(error: unknown): boolean {
  if (!(error instanceof JetStreamApiError)) return false;
  if (error.code === STREAM_NOT_FOUND) return true;
  return /no message found|sequence not found/i.test(error.message);
}

/**
 * The NATS transport's dead letters: the messages of a channel's dead-letter stream (work-queue
 * retention: a message stays until a consumer of the dead-letter channel acks it, or it is
 * deleted). Reading by sequence number takes nothing from the stream and leaves its consumer as
 * it was, so browsing changes nothing. Ids are sequence numbers in the dead-letter stream.
 *
 * A replay publishes with a `Nats-Msg-Id` made of the dead-letter stream, the sequence and the
 * time it was stored, then deletes the dead letter: two replays of one dead letter at once (two
 * processes, say) are stored once by the original channel's stream, within its duplicate window,
 * and a call whose publish was such a duplicate and whose delete found nothing reports the id
 * missing (the other did it). Nothing is held, so
 * calls need no lock: a long replay does not hold up a browse or a discard.
 */
export class NatsDeadLetterBox implements DeadLetterBox {
  readonly browseIsNonDestructive = true;

  constructor(private readonly access: NatsDeadLetterAccess) {}

  async count(channel: string, at?: DeadLetterLocation): Promise<number> {
    const stream = this.access.stream(this.where(channel, at));
    const jsm = await this.access.jsm();
    const info = await jsm.streams.info(stream).catch((error: unknown) => {
      if (error instanceof JetStreamApiError && error.code === STREAM_NOT_FOUND) return undefined;
      throw error;
    });
    return info?.state.messages ?? 0;
  }

  async browse(
    channel: string,
    options: { readonly limit: number; readonly reason?: string } & DeadLetterLocation,
  ): Promise<DeadLetterPage> {
    const limit = browseLimit(options.limit);
    const subject = this.where(channel, options);
    const stream = this.access.stream(subject);
    const jsm = await this.access.jsm();
    const info = await jsm.streams.info(stream).catch((error: unknown) => {
      if (error instanceof JetStreamApiError && error.code === STREAM_NOT_FOUND) return undefined;
      throw error;
    });
    const total = info?.state.messages ?? 0;
    const items: DeadLetter[] = [];
    if (!info || total === 0) return { items, total };
    let next = info.state.first_seq;
    for (let read = 0; read < MAX_DEAD_LETTER_BROWSE && items.length < limit; read++) {
      const query = { seq: next, next_by_subj: subject } as unknown as MsgRequest;
      const stored = await jsm.streams.getMessage(stream, query);
      if (!stored) break;
      next = stored.seq + 1;
      const letter = describe(channel, subject, stored);
      if (reasonMatches(letter.reason, options.reason)) items.push(letter);
    }
    return { items, total };
  }

  async body(channel: string, id: string, at?: DeadLetterLocation): Promise<Buffer | undefined> {
    const subject = this.where(channel, at);
    const stored = await this.get(subject, id);
    return stored && Buffer.from(stored.data);
  }

  async replay(
    channel: string,
    ids: readonly string[],
    options: { readonly ratePerSecond: number } & DeadLetterLocation,
  ): Promise<DeadLetterActionResult> {
    const pacer = new Pacer(options.ratePerSecond);
    const subject = this.where(channel, options);
    const stream = this.access.stream(subject);
    return actOnEach(ids, async (id) => {
      if (!(await this.get(subject, id))) return 'missing';
      await pacer.next();
      const stored = await this.get(subject, id);
      if (!stored) return 'missing';
      const headers = replayHeaders(decode(stored), Date.now()) as HeaderMap;
      const msgId = forwardMsgId('replay', storedKey(stream, stored));
      let duplicate: boolean;
      try {
        ({ duplicate } = await this.access.publish(
          channel,
          Buffer.from(stored.data),
          headers,
          msgId,
        ));
      } catch (error) {
        // Handed to the server without a PubAck: it may be stored and delivered already.
        if (error instanceof PublishTimeoutError && error.maybeSent) {
          return { uncertain: unconfirmedReplay(error) };
        }
        throw error;
      }
      let removed: boolean;
      try {
        removed = await this.remove(stream, stored.seq);
      } catch (error) {
        // Republished and confirmed: replaying it again would deliver it twice.
        return { uncertain: `republished, but not removed: ${errorMessage(error)}` };
      }
      // Gone meanwhile and our publish a duplicate: another replay did it, not this one.
      return removed || !duplicate ? 'done' : 'missing';
    });
  }

  async discard(
    channel: string,
    ids: readonly string[],
    at?: DeadLetterLocation,
  ): Promise<DeadLetterActionResult> {
    const subject = this.where(channel, at);
    const stream = this.access.stream(subject);
    return actOnEach(ids, async (id) => {
      const stored = await this.get(subject, id);
      if (!stored) return 'missing';
      return (await this.remove(stream, stored.seq)) ? 'done' : 'missing';
    });
  }

  private where(channel: string, at: DeadLetterLocation | undefined): string {
    return at?.deadLetterChannel ?? this.access.deadLetterChannel(channel);
  }

  /** The dead letter `id` of the dead-letter channel `subject`, or undefined. */
  private async get(subject: string, id: string): Promise<StoredMsg | undefined> {
    const seq = Number(id);
    if (!/^[1-9][0-9]*$/.test(id) || !Number.isSafeInteger(seq)) return undefined;
    const jsm = await this.access.jsm();
    try {
      const stored = await jsm.streams.getMessage(this.access.stream(subject), { seq });
      return stored && stored.subject === subject ? stored : undefined;
    } catch (error) {
      if (error instanceof JetStreamApiError && error.code === STREAM_NOT_FOUND) return undefined;
      throw error;
    }
  }

  /**
   * Deletes one message; false when it was not there (any more). Any other refusal (a stream
   * that denies deletes, one without a leader) is thrown: the dead letter is still there.
   */
  private async remove(stream: string, seq: number): Promise<boolean> {
    const jsm = await this.access.jsm();
    try {
      return await jsm.streams.deleteMessage(stream, seq, false);
    } catch (error) {
      if (deleteFoundNothing(error)) return false;
      throw error;
    }
  }
}

/** A stored dead letter's headers; none when the client cannot read them (see readHeaders). */
function decode(stored: StoredMsg): Record<string, unknown> {
  return readHeaders(() => stored.header).headers;
}

function describe(channel: string, subject: string, stored: StoredMsg): DeadLetter {
  const { headers, problem } = readHeaders(() => stored.header);
  return {
    id: String(stored.seq),
    channel,
    deadLetterChannel: subject,
    reason: problem === undefined ? deathReasonOf(headers) : unreadableHeadersReason(problem),
    headers,
    bytes: stored.data.length + headerBytes(headers as HeaderMap),
    deadLetteredAt: stored.time.getTime(),
    replays: replaysOf(headers),
  };
}
