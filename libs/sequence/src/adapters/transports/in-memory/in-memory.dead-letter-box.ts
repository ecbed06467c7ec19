import type { HeaderMap } from '../../../core/headers';
import {
  actOnEach,
  browseLimit,
  deathReasonOf,
  Pacer,
  reasonMatches,
  replayHeaders,
  replaysOf,
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

/** A message as the in-memory transport queues it. */
export interface QueuedMessage {
  readonly body: Buffer;
  readonly headers: HeaderMap;
  redelivered: boolean;
  /** When it entered the queue it is in (ms since the epoch). */
  readonly queuedAt: number;
}

/** What the box needs of the in-memory transport's queues. */
export interface InMemoryQueues {
  /** The messages waiting in `channel`, oldest first (the live array: not to be changed). */
  waiting(channel: string): readonly QueuedMessage[];
  /** Takes `message` out of `channel`'s waiting messages; false when it is not there. */
  remove(channel: string, message: QueuedMessage): boolean;
  /** Publishes at once (enqueueing is the confirm), or throws as `publish` rejects. */
  publishNow(channel: string, body: Buffer, headers: HeaderMap): void;
  deadLetterChannel(channel: string): string;
}

/**
 * The in-memory transport's dead letters: the messages waiting in a dead-letter channel. Ids are
 * numbers given to messages the first time a browse shows them, kept for as long as the message
 * lives. A dead letter that a subscriber of the dead-letter channel holds, not yet
 * settled, is not waiting: browse does not show it and actions find it missing.
 */
export class InMemoryDeadLetterBox implements DeadLetterBox {
  private readonly ids = new WeakMap<QueuedMessage, string>();
  private nextId = 1;

  readonly browseIsNonDestructive = true;

  constructor(private readonly queues: InMemoryQueues) {}

  async count(channel: string, at?: DeadLetterLocation): Promise<number> {
    return this.queues.waiting(this.where(channel, at)).length;
  }

  async browse(
    channel: string,
    options: { readonly limit: number; readonly reason?: string } & DeadLetterLocation,
  ): Promise<DeadLetterPage> {
    const limit = browseLimit(options.limit);
    const deadLetterChannel = this.where(channel, options);
    const waiting = this.queues.waiting(deadLetterChannel);
    const items: DeadLetter[] = [];
    for (const message of waiting.slice(0, MAX_DEAD_LETTER_BROWSE)) {
      if (items.length >= limit) break;
      const letter = this.describe(channel, deadLetterChannel, message);
      if (reasonMatches(letter.reason, options.reason)) items.push(letter);
    }
    return { items, total: waiting.length };
  }

  async body(channel: string, id: string, at?: DeadLetterLocation): Promise<Buffer | undefined> {
    const found = this.find(this.where(channel, at), id);
    return found && Buffer.from(found.body);
  }

  async replay(
    channel: string,
    ids: readonly string[],
    options: { readonly ratePerSecond: number } & DeadLetterLocation,
  ): Promise<DeadLetterActionResult> {
    const pacer = new Pacer(options.ratePerSecond);
    const deadLetterChannel = this.where(channel, options);
    return actOnEach(ids, async (id) => {
      if (!this.find(deadLetterChannel, id)) return 'missing';
      await pacer.next();
      // Found again after the wait: it may have gone meanwhile (replayed or discarded by another
      // call, taken by a subscriber of the dead-letter channel).
      const message = this.find(deadLetterChannel, id);
      if (!message) return 'missing';
      const headers = replayHeaders(message.headers, Date.now()) as HeaderMap;
      this.queues.publishNow(channel, message.body, headers);
      this.queues.remove(deadLetterChannel, message);
      return 'done';
    });
  }

  async discard(
    channel: string,
    ids: readonly string[],
    at?: DeadLetterLocation,
  ): Promise<DeadLetterActionResult> {
    const deadLetterChannel = this.where(channel, at);
    return actOnEach(ids, async (id) => {
      const message = this.find(deadLetterChannel, id);
      return message && this.queues.remove(deadLetterChannel, message) ? 'done' : 'missing';
    });
  }

  private where(channel: string, at: DeadLetterLocation | undefined): string {
    return at?.deadLetterChannel ?? this.queues.deadLetterChannel(channel);
  }

  private describe(channel: string, deadLetterChannel: string, message: QueuedMessage): DeadLetter {
    return {
      id: this.idOf(message),
      channel,
      deadLetterChannel,
      reason: deathReasonOf(message.headers),
      headers: { ...message.headers },
      bytes: message.body.length + headerBytes(message.headers),
      deadLetteredAt: message.queuedAt,
      replays: replaysOf(message.headers),
    };
  }

  private find(deadLetterChannel: string, id: string): QueuedMessage | undefined {
    const waiting = this.queues.waiting(deadLetterChannel);
    const reach = Math.min(waiting.length, MAX_DEAD_LETTER_BROWSE);
    for (let index = 0; index < reach; index++) {
      // Only ids a browse handed out: a message never browsed has none, so it cannot match.
      if (this.ids.get(waiting[index]) === id) return waiting[index];
    }
    return undefined;
  }

  private idOf(message: QueuedMessage): string {
    let id = this.ids.get(message);
    if (id === undefined) {
      id = String(this.nextId++);
      this.ids.set(message, id);
    }
    return id;
  }
}
