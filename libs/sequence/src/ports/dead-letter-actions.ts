import { createHash } from 'node:crypto';
import { delay } from '../core/async';
import { errorMessage } from '../core/errors/caught';
import type { PublishTimeoutError } from '../core/errors/publish-timeout.error';
import { splitDeathReason } from '../core/errors/rejection-code';
import { SequenceHeader } from '../core/headers';
import {
  MAX_DEAD_LETTER_BROWSE,
  REPLAY_COUNT_HEADER,
  REPLAYED_AT_HEADER,
  type DeadLetterActionResult,
} from './dead-letter-box.port';
import { countIn } from './transport.port';

/**
 * What every {@link DeadLetterBox} adapter shares: argument checks, the reason filter, the headers
 * of a replay, pacing and the bookkeeping of an action's result.
 */

/** `limit` as a browse takes it; a RangeError saying what to fix otherwise. */
export function browseLimit(limit: unknown): number {
  if (
    typeof limit !== 'number' ||
    !Number.isSafeInteger(limit) ||
    limit < 1 ||
    limit > MAX_DEAD_LETTER_BROWSE
  ) {
    throw new RangeError(
      `limit must be an integer from 1 to ${MAX_DEAD_LETTER_BROWSE}, got ${String(limit)}`,
    );
  }
  return limit;
}

/** `ratePerSecond` as a replay takes it; a RangeError saying what to fix otherwise. */
export function replayRate(ratePerSecond: unknown): number {
  if (typeof ratePerSecond !== 'number' || !Number.isFinite(ratePerSecond) || ratePerSecond <= 0) {
    throw new RangeError(
      `ratePerSecond must be a positive number of replays per second, got ${String(ratePerSecond)}`,
    );
  }
  return ratePerSecond;
}

/**
 * Whether a dead letter's `reason` passes the filter: the whole reason or its code, the group
 * the reasons are counted in (`splitDeathReason`, trimmed: `'expired '` is in `expired`, `' '` in
 * `''`).
 */
export function reasonMatches(reason: string, filter: string | undefined): boolean {
  if (filter === undefined) return true;
  return reason === filter || splitDeathReason(reason).code === filter;
}

/** `x-death-reason` of a dead letter, or `fallback` when it has none (a broker-routed one). */
export function deathReasonOf(headers: Readonly<Record<string, unknown>>, fallback = ''): string {
  const reason = headers[SequenceHeader.deathReason];
  return typeof reason === 'string' ? reason : fallback;
}

/** How many times a dead letter was replayed before (`x-replay-count`), 0 when never. */
export function replaysOf(headers: Readonly<Record<string, unknown>>): number {
  return countIn(headers[REPLAY_COUNT_HEADER]);
}

/**
 * The headers a dead letter is replayed with: its own, without `x-death-reason` (and without the
 * names `drop` picks: a broker's own dead-lettering records), with `x-replay-count` incremented and
 * `x-replayed-at` set to `now`.
 */
export function replayHeaders(
  headers: Readonly<Record<string, unknown>>,
  now: number,
  drop: (name: string) => boolean = () => false,
): Record<string, unknown> {
  const own: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (name === SequenceHeader.deathReason || drop(name)) continue;
    own[name] = value;
  }
  return { ...own, [REPLAY_COUNT_HEADER]: replaysOf(headers) + 1, [REPLAYED_AT_HEADER]: now };
}

/**
 * An id made from a dead letter's content, for one that carries no id of its own: the same
 * message gives the same id on every browse.
 */
export function contentId(body: Buffer, headers: Readonly<Record<string, unknown>>): string {
  const hash = createHash('sha256').update(body);
  for (const name of Object.keys(headers).sort()) {
    hash.update(`\n${name}=${JSON.stringify(headers[name])}`);
  }
  return `h-${hash.digest('hex').slice(0, 32)}`;
}

/**
 * Makes ids unique within one read of a channel: the second message with base id `x` (two copies
 * of one message, say) is `x~2`, the third `x~3`. Stable while the ones ahead of it stay.
 */
export class OccurrenceIds {
  private readonly seen = new Map<string, number>();

  next(base: string): string {
    const count = (this.seen.get(base) ?? 0) + 1;
    this.seen.set(base, count);
    return count === 1 ? base : `${base}~${count}`;
  }
}

/**
 * Spaces calls to `next()` to `ratePerSecond`: the first goes at once, the n-th no sooner than
 * (n - 1) / ratePerSecond seconds after the first.
 */
export class Pacer {
  private readonly intervalMs: number;
  private started?: number;
  private count = 0;

  constructor(
    ratePerSecond: number,
    private readonly now: () => number = Date.now,
    private readonly sleep: (ms: number) => Promise<void> = delay,
  ) {
    this.intervalMs = 1_000 / replayRate(ratePerSecond);
  }

  async next(): Promise<void> {
    this.started ??= this.now();
    const due = this.started + this.count * this.intervalMs;
    this.count += 1;
    const wait = due - this.now();
    if (wait > 0) await this.sleep(wait);
  }
}

/**
 * Why a replay is `uncertain` when its publish reached the broker but was not confirmed in time:
 * the broker may have stored it, and the dead letter stays.
 */
export function unconfirmedReplay(error: PublishTimeoutError): string {
  return (
    `${error.message}: it may have been replayed, so the dead letter is kept; check whether it ` +
    'was delivered before you replay it again or discard it'
  );
}

/**
 * What an adapter found an id to be; `uncertain`: maybe replayed while the dead letter stays (see
 * `DeadLetterActionResult.uncertain`), with why.
 */
export type ActionOutcome = 'done' | 'missing' | { readonly uncertain: string };

/**
 * Runs `act` on each distinct id in turn (a repeated id counts once) and sorts them into the
 * result's lists: `done`, `missing`, `uncertain`, or `failed` with the message of what `act`
 * threw.
 */
export async function actOnEach(
  ids: readonly string[],
  act: (id: string) => Promise<ActionOutcome>,
): Promise<DeadLetterActionResult> {
  const done: string[] = [];
  const missing: string[] = [];
  const failed: Array<{ id: string; error: string }> = [];
  const uncertain: Array<{ id: string; error: string }> = [];
  for (const id of new Set(ids)) {
    try {
      const outcome = await act(id);
      if (outcome === 'done') done.push(id);
      else if (outcome === 'missing') missing.push(id);
      else uncertain.push({ id, error: outcome.uncertain });
    } catch (error) {
      failed.push({ id, error: errorMessage(error) });
    }
  }
  return uncertain.length > 0 ? { done, missing, failed, uncertain } : { done, missing, failed };
}

/**
 * At most `max` pieces of work at once within this process, the others waiting in turn: bounds how
 * many reads that take messages (and hold them) a burst of requests can start together.
 */
export class Permits {
  private active = 0;
  private readonly waiting: Array<() => void> = [];

  constructor(private readonly max: number) {}

  async run<T>(work: () => Promise<T>): Promise<T> {
    if (this.active >= this.max) {
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    } else {
      this.active += 1;
    }
    try {
      return await work();
    } finally {
      // Hand the permit straight to the next in line, or give it back.
      const next = this.waiting.shift();
      if (next) next();
      else this.active -= 1;
    }
  }
}

/** An empty result: nothing asked, nothing done. */
export const NOTHING_DONE: DeadLetterActionResult = { done: [], missing: [], failed: [] };

/**
 * Serializes the actions on one dead-letter channel within this process: a browse that holds
 * messages for a moment must not make a concurrent replay find its ids missing.
 */
export class ChannelLocks {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(channel: string, work: () => Promise<T>): Promise<T> {
    const previous = this.tails.get(channel) ?? Promise.resolve();
    const result = previous.then(work, work);
    const tail = result.catch(() => undefined);
    this.tails.set(channel, tail);
    void tail.then(() => {
      if (this.tails.get(channel) === tail) this.tails.delete(channel);
    });
    return result;
  }
}
