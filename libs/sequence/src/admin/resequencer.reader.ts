import { Injectable } from '@nestjs/common';
import { isResequencerKey } from '../ports/resequencer-store.port';
import type { Resequencer } from '../resequencer/resequencer';
import { ResequencerCatalog } from '../resequencer/resequencer.catalog';
import type { MutationAnswer } from './admin-actions';
import { parseResequencerKey } from './admin-input';
import { badRequest, notFound } from './admin.errors';

/** A resequencer key waiting on a gap. */
export interface GapItem {
  readonly resequencer: string;
  readonly key: string;
  /** The sequence the key waits for. */
  readonly expected: number;
  /** Events held behind the gap. */
  readonly held: number;
  /** The lowest held sequence. */
  readonly lowest: number;
  /** When the gap opened (ms since the epoch). */
  readonly since: number;
  readonly ageMs: number;
  /** The resequencer's gap timeout: older gaps are overdue for its policy. */
  readonly timeoutMs: number;
  /** The `'alert'` policy reported it already. */
  readonly alerted: boolean;
}

/** What a skip or a release did to a key. */
export type GapAnswer = MutationAnswer & {
  /** Gaps skipped (each given up as the `'skip'` policy would). */
  readonly skippedGaps: number;
  /** Held events released to the handler or output channel. */
  readonly released: number;
  /** The key's next expected sequence afterwards. */
  readonly next: number;
};

/** Resequencer keys and their gaps, through the resequencers of the application. */
@Injectable()
export class ResequencerReader {
  constructor(private readonly catalog: ResequencerCatalog) {}

  names(): string[] {
    return this.catalog.all().map(({ resequencer }) => resequencer.name);
  }

  /** Keys waiting on a gap across every resequencer, counted by the stores (no cap). */
  async gapTotals(): Promise<{ openGaps: number; oldestGapAgeMs: number }> {
    let openGaps = 0;
    let oldestGapAgeMs = 0;
    for (const { resequencer } of this.catalog.all()) {
      const stats = await resequencer.gapStats();
      openGaps += stats.openGaps;
      oldestGapAgeMs = Math.max(oldestGapAgeMs, stats.oldestGapAgeMs ?? 0);
    }
    return { openGaps, oldestGapAgeMs };
  }

  async gaps(limit: number): Promise<GapItem[]> {
    const now = Date.now();
    const items: GapItem[] = [];
    for (const { resequencer } of this.catalog.all()) {
      for (const gap of await resequencer.openGaps(limit)) {
        items.push({
          resequencer: resequencer.name,
          key: gap.key,
          expected: gap.expected,
          held: gap.buffered,
          lowest: gap.lowest,
          since: gap.gapSince,
          ageMs: Math.max(0, now - gap.gapSince),
          timeoutMs: resequencer.definition.gap.timeoutMs,
          alerted: gap.alerted,
        });
      }
    }
    return items.sort((a, b) => a.since - b.since).slice(0, limit);
  }

  /** The key's state when it holds anything or has moved on, else undefined. */
  async key(name: string, key: string) {
    const resequencer = this.resequencer(name);
    if (!isResequencerKey(key)) return undefined;
    const state = await resequencer.inspect(key);
    const known =
      state.buffered.length > 0 || state.handOff > 0 || state.next !== resequencer.definition.start;
    return known ? { resequencer: name, key, ...state } : undefined;
  }

  /**
   * Skips the first gap: the missing sequences are given up, the run behind them released.
   * `since`: the gap's `since` as the operator saw it; a gap opened later is left alone.
   */
  async skip(name: string, key: string, since?: number): Promise<GapAnswer> {
    return this.resolve(name, key, 1, since);
  }

  /**
   * Skips every gap of the key, until nothing is held: everything held is released, in order.
   * `since`: as for {@link skip}, for the first gap.
   */
  async release(name: string, key: string, since?: number): Promise<GapAnswer> {
    return this.resolve(name, key, Number.POSITIVE_INFINITY, since);
  }

  /**
   * @throws AdminRequestError 400 for a key no store could hold or a stream mode resequencer, 404
   * for an unknown resequencer
   */
  private async resolve(
    name: string,
    key: string,
    maxGaps: number,
    since?: number,
  ): Promise<GapAnswer> {
    const resequencer = this.resequencer(name);
    parseResequencerKey(key);
    if (resequencer.definition.closeAfterDeadLetter !== undefined) {
      // Skipped, the sequence would reach its end with a fragment missing.
      throw badRequest(
        `resequencer ${name} orders the fragments of streamed sequences: a gap of sequence ${key} ` +
          'cannot be skipped (its handler would see the end of a payload with a fragment ' +
          'missing); it is dead-lettered when its timeout passes',
      );
    }
    const before = await resequencer.inspect(key);
    let skippedGaps = 0;
    // Counted from what each skip released, not from the buffer's size before and after, which
    // events arriving meanwhile change.
    let released = 0;
    // Each skip releases at least one held event, so this ends within `buffered` rounds.
    const rounds = Math.min(maxGaps, before.buffered.length);
    for (let round = 0; round < rounds; round++) {
      // The first gap only if it is the one seen (a later gap opens as the one before is skipped).
      const now = Date.now();
      const appended = await resequencer.skipGap(key, now, round === 0 ? (since ?? now) : now);
      if (appended === 0) break;
      skippedGaps++;
      released += appended - 1;
    }
    const after = await resequencer.inspect(key);
    const message =
      skippedGaps === 0
        ? `nothing changed: key ${key} of resequencer ${name} has no open gap ` +
          (since === undefined
            ? '(it filled, or was skipped or resolved already)'
            : 'opened by the time given (it filled, or was skipped or resolved already, and ' +
              'any gap open now opened since: look again)')
        : `skipped ${skippedGaps} gap(s) of key ${key}, released ${released} held event(s); ` +
          `next expected is now ${after.next}`;
    return { changed: skippedGaps, message, skippedGaps, released, next: after.next };
  }

  private resequencer(name: string): Resequencer {
    const entry = this.catalog.get(name);
    if (!entry) {
      throw notFound(
        `no resequencer named ${name} in this application (known: ${this.names().join(', ') || 'none'})`,
      );
    }
    return entry.resequencer;
  }
}
