import type { Channel, GetMessage, Message } from 'amqplib';
import { brokerDeathReason } from '../../../core/broker-death';
import { errorMessage } from '../../../core/errors/caught';
import { PublishTimeoutError } from '../../../core/errors/publish-timeout.error';
import type { HeaderMap } from '../../../core/headers';
import {
  browseLimit,
  ChannelLocks,
  contentId,
  deathReasonOf,
  OccurrenceIds,
  Pacer,
  Permits,
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
import type { BrokerConnection } from './amqp.types';
import { MAX_QUEUE_NAME_BYTES } from './rabbitmq.topology';

/** What the box needs of the RabbitMQ transport. */
export interface RabbitMqDeadLetterAccess {
  /** The current connection; throws when there is none. */
  connection(): BrokerConnection;
  /** The transport's publish: resolves on the broker's confirm. */
  publish(channel: string, body: Buffer, headers: HeaderMap): Promise<void>;
  deadLetterChannel(channel: string): string;
}

/** A dead letter taken with `basic.get`, held unacknowledged until it is acked or put back. */
interface Held {
  readonly message: GetMessage;
  readonly id: string;
}

/** What is kept of a message taken only to be put back: enough to nack it, not its body. */
type TakenMessage = Pick<Message, 'fields'>;

/**
 * A replay that may have been delivered while its dead letter stays: the publish was not
 * confirmed after it reached the broker, or it was confirmed and the ack that removes the dead
 * letter failed.
 */
class MaybeReplayed extends Error {
  override readonly name = 'MaybeReplayed';
}

/** What an action came to for one id. */
type Outcome = 'done' | 'missing' | { readonly failed: string } | { readonly uncertain: string };

/** Reads that take messages at once, across all dead-letter queues, in this process. */
const CONCURRENT_READS = 2;

/** Header of a message's stable id, kept on a replayed copy so that an inbox deduplicates it. */
const MESSAGE_ID_HEADER = 'x-message-id';

/** The broker's own records of a dead-lettering (and of deliveries): left out of a replay. */
function isBrokerRecord(name: string): boolean {
  return (
    name === 'x-death' ||
    name === 'x-delivery-count' ||
    name.startsWith('x-first-death-') ||
    name.startsWith('x-last-death-')
  );
}

/** AMQP reply code of a queue that does not exist. */
const NOT_FOUND = 404;

/**
 * The RabbitMQ transport's dead letters: the messages ready in a channel's dead-letter queue.
 *
 * RabbitMQ has no way to read a queue without taking messages off it, so each call reads with
 * `basic.get` (unacknowledged) on a channel of its own, up to {@link MAX_DEAD_LETTER_BROWSE}
 * messages from the head, and puts back what it does not remove with `basic.nack` (requeue),
 * within the call; closing that channel puts back whatever a failure left held. Meanwhile those
 * messages are not delivered to a consumer of the dead-letter queue; put back, they return to
 * their place in the queue and are redelivered flagged as such.
 *
 * Ids: the message's `messageId` property (the transport gives every message it publishes, dead
 * letters included, an id of its own), or a hash of its content when it has none; a second message
 * with the same id within one read gets `~2`. Reads of one dead-letter queue (a browse, a round of
 * a replay) run one at a time within the process; a read in another process at the same moment
 * does not see the messages this one holds (they are missing for it, and come back).
 */
export class RabbitMqDeadLetterBox implements DeadLetterBox {
  /** Browsing takes messages and puts them back: each read is a redelivery. */
  readonly browseIsNonDestructive = false;
  private readonly locks = new ChannelLocks();
  private readonly permits = new Permits(CONCURRENT_READS);

  constructor(private readonly access: RabbitMqDeadLetterAccess) {}

  /** The broker's count of messages ready in the dead-letter queue (`queue.declare` passive). */
  async count(channel: string, at?: DeadLetterLocation): Promise<number> {
    const queue = this.where(channel, at);
    return this.session(queue, 0, async (_amqp, ready) => ready, false);
  }

  async browse(
    channel: string,
    options: { readonly limit: number; readonly reason?: string } & DeadLetterLocation,
  ): Promise<DeadLetterPage> {
    const limit = browseLimit(options.limit);
    const queue = this.where(channel, options);
    const empty: DeadLetterPage = { items: [], total: 0 };
    return this.locks.run(queue, () =>
      this.session(queue, empty, async (amqp, ready) => {
        const items: DeadLetter[] = [];
        const { taken, readAll } = await this.read(amqp, queue, (held) => {
          const letter = describe(channel, queue, held);
          if (reasonMatches(letter.reason, options.reason)) items.push(letter);
          // Without a filter, the first `limit` are all there is to read.
          return items.length >= limit ? 'stop' : 'more';
        });
        putBack(amqp, taken);
        // Read to the end, it counted them all; else the broker's count, which may lag.
        return { items, total: readAll ? taken.length : Math.max(ready, taken.length) };
      }),
    );
  }

  async body(channel: string, id: string, at?: DeadLetterLocation): Promise<Buffer | undefined> {
    const queue = this.where(channel, at);
    return this.locks.run(queue, () =>
      this.session<Buffer | undefined>(queue, undefined, async (amqp) => {
        let found: Buffer | undefined;
        const { taken } = await this.read(amqp, queue, (held) => {
          if (held.id !== id) return 'more';
          found = Buffer.from(held.message.content);
          return 'stop';
        });
        putBack(amqp, taken);
        return found;
      }),
    );
  }

  /**
   * Replays in rounds of about a second's worth of replays at `ratePerSecond`: each round reads
   * the queue again, holds the dead letters it replays, puts the others back at once, then
   * publishes the ones it holds, acking each after its confirm.
   */
  async replay(
    channel: string,
    ids: readonly string[],
    options: { readonly ratePerSecond: number } & DeadLetterLocation,
  ): Promise<DeadLetterActionResult> {
    const pacer = new Pacer(options.ratePerSecond);
    const perRound = Math.max(1, Math.min(Math.ceil(options.ratePerSecond), 100));
    const queue = this.where(channel, options);
    return this.inRounds(queue, ids, perRound, async (amqp, held) => {
      await pacer.next();
      const headers = replayHeaders(headersOf(held.message), Date.now(), isBrokerRecord);
      headers[MESSAGE_ID_HEADER] ??= baseIdOf(held.message);
      try {
        await this.access.publish(channel, held.message.content, headers as HeaderMap);
      } catch (error) {
        // Handed to the broker without a confirm: it may be stored and delivered already.
        if (error instanceof PublishTimeoutError && error.maybeSent) {
          throw new MaybeReplayed(unconfirmedReplay(error));
        }
        throw error;
      }
      try {
        amqp.ack(held.message);
      } catch (error) {
        // Published already: the channel closing put the dead letter back, a copy is out.
        throw new MaybeReplayed(
          `replayed, but removing the dead letter failed (${errorMessage(error)}): it may still ` +
            'be in the dead-letter queue; do not replay it again',
        );
      }
    });
  }

  async discard(
    channel: string,
    ids: readonly string[],
    at?: DeadLetterLocation,
  ): Promise<DeadLetterActionResult> {
    const queue = this.where(channel, at);
    return this.inRounds(queue, ids, MAX_DEAD_LETTER_BROWSE, async (amqp, held) => {
      amqp.ack(held.message);
    });
  }

  private where(channel: string, at: DeadLetterLocation | undefined): string {
    return at?.deadLetterChannel ?? this.access.deadLetterChannel(channel);
  }

  /**
   * Acts on the dead letters `ids` name, at most `perRound` held at once. A dead letter `act`
   * fails on is put back and reported failed (uncertain when `act` failed after publishing); ids
   * not among the messages read are missing. A round that fails as a whole (no channel, the queue
   * check refused) marks the ids still wanted failed and keeps what earlier rounds did.
   */
  private async inRounds(
    queue: string,
    ids: readonly string[],
    perRound: number,
    act: (amqp: Channel, held: Held) => Promise<void>,
  ): Promise<DeadLetterActionResult> {
    const outcomes = new Map<string, Outcome>();
    const wanted = new Set(ids);
    while (wanted.size > 0) {
      let round: { readAll: boolean; found: number };
      try {
        // One round at a time per queue in this process, so that a browse in between cannot hold
        // what a round looks for; a long replay still lets browses through between its rounds.
        round = await this.locks.run(queue, () =>
          this.session(queue, { readAll: true, found: 0 }, async (amqp) => {
            const targets: Held[] = [];
            const others: TakenMessage[] = [];
            const { readAll } = await this.read(amqp, queue, (held) => {
              if (wanted.has(held.id) && !targets.some((t) => t.id === held.id)) targets.push(held);
              else others.push(held.message);
              if (targets.length < Math.min(perRound, wanted.size)) return 'more';
              // Identical dead letters (`<id>`, `<id>~2`, …) are numbered afresh by each read: a
              // group split across rounds would be looked for under ids its rest no longer has.
              return splitsGroup(targets, wanted) ? 'more' : 'stop';
            });
            // Back at once: only the ones acted on stay held while they are.
            putBack(amqp, others);
            for (const held of targets) {
              wanted.delete(held.id);
              outcomes.set(held.id, await this.actOn(amqp, held, act));
            }
            return { readAll, found: targets.length };
          }),
        );
      } catch (error) {
        for (const id of wanted) outcomes.set(id, { failed: errorMessage(error) });
        break;
      }
      if (round.readAll || round.found === 0) {
        // Read to the end: what was not found is not there.
        for (const id of wanted) outcomes.set(id, 'missing');
        wanted.clear();
      }
    }
    return sortOutcomes(ids, outcomes);
  }

  private async actOn(
    amqp: Channel,
    held: Held,
    act: (amqp: Channel, held: Held) => Promise<void>,
  ): Promise<Outcome> {
    try {
      await act(amqp, held);
      return 'done';
    } catch (error) {
      try {
        amqp.nack(held.message, false, true);
      } catch {
        // The channel is gone: closing it put the message back already.
      }
      return error instanceof MaybeReplayed
        ? { uncertain: error.message }
        : { failed: errorMessage(error) };
    }
  }

  /**
   * Reads up to {@link MAX_DEAD_LETTER_BROWSE} messages from the head of `queue`, handing each to
   * `visit` until it says stop. Gives what it took (held: the caller puts it back or acks it) and
   * whether it read all there was to read. Reads until the queue answers empty rather than
   * counting on `ready`: a quorum queue's count lags behind the messages just put back.
   */
  private async read(
    amqp: Channel,
    queue: string,
    visit: (held: Held) => 'stop' | 'more',
  ): Promise<{ taken: TakenMessage[]; readAll: boolean }> {
    const ids = new OccurrenceIds();
    // Only what a nack needs: a body is kept by `visit` alone, when it wants it.
    const taken: TakenMessage[] = [];
    while (taken.length < MAX_DEAD_LETTER_BROWSE) {
      const message = await amqp.get(queue, { noAck: false });
      if (message === false) return { taken, readAll: true };
      taken.push({ fields: message.fields });
      if (visit({ message, id: ids.next(baseIdOf(message)) }) === 'stop') {
        return { taken, readAll: false };
      }
    }
    return { taken, readAll: false };
  }

  /**
   * Runs `work` on a channel of its own, with the count of messages ready in `queue` the broker
   * gives, then closes the channel (which puts back anything still held). A queue that does not
   * exist is empty: `work` is not run, `empty` is the answer. So is one whose name is too long
   * for AMQP to carry (amqplib would throw a TypeError): no queue has it.
   */
  private async session<T>(
    queue: string,
    empty: T,
    work: (amqp: Channel, ready: number) => Promise<T>,
    takes = true,
  ): Promise<T> {
    if (Buffer.byteLength(queue) > MAX_QUEUE_NAME_BYTES) return empty;
    if (takes) return this.permits.run(() => this.session(queue, empty, work, false));
    const amqp = await this.access.connection().createChannel();
    // Without a listener, a channel closed by the broker (a missing queue) throws.
    amqp.on('error', () => undefined);
    try {
      let ready: number;
      try {
        ready = (await amqp.checkQueue(queue)).messageCount;
      } catch (error) {
        if ((error as { code?: unknown }).code !== NOT_FOUND) throw error;
        return empty;
      }
      return await work(amqp, ready);
    } finally {
      await amqp.close().catch(() => undefined);
    }
  }
}

/**
 * Puts messages back one by one, in the order they were taken: a quorum queue re-enqueues returns
 * in the order it receives them (a single `nackAll` gives it no order).
 */
function putBack(amqp: Channel, messages: readonly TakenMessage[]): void {
  for (const message of messages) amqp.nack(message as Message, false, true);
}

/** The action's result, in the order the ids came, each distinct id once. */
function sortOutcomes(
  ids: readonly string[],
  outcomes: ReadonlyMap<string, Outcome>,
): DeadLetterActionResult {
  const done: string[] = [];
  const missing: string[] = [];
  const failed: Array<{ id: string; error: string }> = [];
  const uncertain: Array<{ id: string; error: string }> = [];
  for (const id of new Set(ids)) {
    const outcome = outcomes.get(id) ?? 'missing';
    if (outcome === 'done') done.push(id);
    else if (outcome === 'missing') missing.push(id);
    else if ('failed' in outcome) failed.push({ id, error: outcome.failed });
    else uncertain.push({ id, error: outcome.uncertain });
  }
  return uncertain.length > 0 ? { done, missing, failed, uncertain } : { done, missing, failed };
}

function headersOf(message: GetMessage): Record<string, unknown> {
  return message.properties.headers ?? {};
}

function baseIdOf(message: GetMessage): string {
  const messageId: unknown = message.properties.messageId;
  if (typeof messageId === 'string' && messageId.length > 0) return messageId;
  return contentId(message.content, headersOf(message));
}

function describe(channel: string, queue: string, held: Held): DeadLetter {
  const headers = headersOf(held.message);
  return {
    id: held.id,
    channel,
    deadLetterChannel: queue,
    reason: deathReasonOf(headers, brokerDeathReason(headers) ?? ''),
    headers: { ...headers },
    bytes: held.message.content.length + headerBytes(headers as HeaderMap),
    deadLetteredAt: brokerDeathTime(headers),
    replays: replaysOf(headers),
  };
}

/** When the broker dead-lettered it (`x-death[0].time`, in seconds), where it did. */
function brokerDeathTime(headers: Readonly<Record<string, unknown>>): number | undefined {
  const deaths = headers['x-death'];
  if (!Array.isArray(deaths) || deaths.length === 0) return undefined;
  const time = (deaths[0] as { time?: unknown } | null)?.time;
  const seconds = typeof time === 'number' ? time : (time as { value?: unknown } | null)?.value;
  return typeof seconds === 'number' ? seconds * 1_000 : undefined;
}

/** The id of the first of a group of identical dead letters: `<id>` for `<id>~<k>`. */
function groupOf(id: string): string {
  return id.replace(/~\d+$/, '');
}

/** Whether an id still wanted belongs to the group of one of `targets` but is not held yet. */
function splitsGroup(targets: readonly Held[], wanted: ReadonlySet<string>): boolean {
  const held = new Set(targets.map((target) => target.id));
  const groups = new Set(targets.map((target) => groupOf(target.id)));
  for (const id of wanted) {
    if (!held.has(id) && groups.has(groupOf(id))) return true;
  }
  return false;
}
