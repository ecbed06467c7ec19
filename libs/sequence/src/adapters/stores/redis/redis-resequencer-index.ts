import type { ExpiringGap, GapStats, OpenGap } from '../../../ports/resequencer-store.port';
import { indexKeyList, type RedisResequencerKeys } from './redis-resequencer-keys';
import {
  interpretExpiringGaps,
  interpretGaps,
  scopeTotals,
  type IndexRecord,
  type ScopeTotals,
} from './redis-resequencer-replies';
import { RedisResequencerStoreError } from './redis-resequencer-store.error';
import type { RedisClock } from './redis-clock';
import type { RedisClient, Scripts } from './redis-scripts';

/**
 * How old a scope's totals may be when `accept` checks `maxBufferedTotal` and
 * `maxBufferedBytesTotal` against them.
 */
export const TOTAL_MAX_AGE_MS = 100;
/** Records of expired keys one index step removes (the rest go with the following steps). */
const PRUNE_BATCH = 100;
/** Records of expired keys {@link RedisResequencerIndex.prune} removes in one call. */
const PRUNE_ON_DEMAND_BATCH = 1_000;

/**
 * The scope-wide half of the Redis resequencer store: per scope, the index of gaps, stalled
 * hand-offs and buffered events, in a slot of its own (see redis.resequencer-store.ts for the
 * protocol that ties it to the per-key keys). Remembers the last total it saw of each scope, so
 * that `accept` rarely needs a round trip to read it.
 */
export class RedisResequencerIndex {
  private readonly totals = new Map<
    string,
    { readonly value: ScopeTotals; readonly seenAt: number; readonly seen: number }
  >();
  /** Counts the totals remembered, so that a prune's answer can tell whether newer ones came. */
  private seen = 0;
  /**
   * The last {@link prune} per scope (real time): one at a time, one per TOTAL_MAX_AGE_MS, and
   * `seen`, the count of totals remembered when it ended (undefined while it runs).
   */
  private readonly prunes = new Map<
    string,
    { readonly at: number; readonly total: Promise<ScopeTotals>; readonly seen?: number }
  >();

  constructor(
    private readonly redis: RedisClient,
    private readonly scripts: Scripts,
    private readonly names: RedisResequencerKeys,
    private readonly retentionMs: number,
    /** Added to the index keys' TTL: the index outlives the keys it indexes. */
    private readonly marginMs: number,
    private readonly clock: RedisClock,
  ) {}

  /** Applies a key's record unless a newer one was applied already; prunes expired keys. */
  async apply(scope: string, key: string, record: IndexRecord, now: number): Promise<void> {
    const reply = await this.scripts['rsq-index'](indexKeyList(this.names.index(scope)), [
      key,
      record.ver,
      record.buffered,
      record.next,
      record.lowest,
      record.gapSince,
      record.alerted ? 1 : 0,
      record.handOffAt,
      record.at,
      this.clock.stamp(now),
      this.retentionMs,
      this.retentionMs + this.marginMs,
      PRUNE_BATCH,
      record.bufferedBytes,
    ]);
    this.remember(scope, this.totalsOf(reply, 'rsq-index', scope));
  }

  /**
   * Drops a retired key's entries (rsq-unindex), unless the index holds a record newer than `ver`
   * (a change after the retirement).
   */
  async unindex(scope: string, key: string, ver: number): Promise<void> {
    await this.scripts['rsq-unindex'](indexKeyList(this.names.index(scope)), [key, ver]);
  }

  /**
   * Removes the records of keys past their retention now, rather than with later index steps;
   * resolves with the scope's totals after. A scope that is really full refuses many events in a
   * row: they share the prune in progress, or one that ended less than {@link TOTAL_MAX_AGE_MS}
   * ago, instead of each scanning its expired records again; unless newer totals came since it
   * ended (events this process buffered meanwhile), which its answer would not count.
   */
  prune(scope: string, now: number): Promise<ScopeTotals> {
    const last = this.prunes.get(scope);
    const current = last && (last.seen === undefined || last.seen === this.totals.get(scope)?.seen);
    if (current && Date.now() - last.at < TOTAL_MAX_AGE_MS) return last.total;
    const total = (async () => {
      const reply = await this.scripts['rsq-prune'](indexKeyList(this.names.index(scope)), [
        this.clock.stamp(now),
        this.retentionMs,
        PRUNE_ON_DEMAND_BATCH,
      ]);
      const after = this.totalsOf(reply, 'rsq-prune', scope);
      this.remember(scope, after);
      // Its age counts from its end: the next may start TOTAL_MAX_AGE_MS after this one is done.
      this.prunes.set(scope, {
        at: Date.now(),
        total: Promise.resolve(after),
        seen: this.totals.get(scope)?.seen,
      });
      return after;
    })();
    // Until it ends, it is shared whatever its age; a failed one is not kept.
    this.prunes.set(scope, { at: Number.POSITIVE_INFINITY, total });
    total.catch(() => this.prunes.delete(scope));
    return total;
  }

  /** What a single-node "-ix" script appends to its arguments to apply the index inline. */
  inlineArguments(key: string, now: number): Array<string | number> {
    return [
      key,
      this.clock.stamp(now),
      this.retentionMs,
      this.retentionMs + this.marginMs,
      PRUNE_BATCH,
    ];
  }

  /** What rsq-accept-batch takes for its inline index steps: the index keys' TTL, the prune batch. */
  batchArguments(): [number, number] {
    return [this.retentionMs + this.marginMs, PRUNE_BATCH];
  }

  /** The scope's totals as last seen, if at most {@link TOTAL_MAX_AGE_MS} old; else read now. */
  async recentTotals(scope: string): Promise<ScopeTotals> {
    const seen = this.totals.get(scope);
    if (seen && Date.now() - seen.seenAt <= TOTAL_MAX_AGE_MS) return seen.value;
    return this.read(scope);
  }

  /** The scope's buffered events and bytes now. */
  async read(scope: string): Promise<ScopeTotals> {
    const keys = this.names.index(scope);
    const [events, bytes] = await Promise.all([
      this.redis.get(keys.total),
      this.redis.hget(keys.records, BYTES_FIELD),
    ]);
    const value = { events: Number(events ?? 0), bytes: Number(bytes ?? 0) };
    this.remember(scope, value);
    return value;
  }

  async gaps(
    scope: string,
    openedBefore: number,
    limit: number,
    includeAlerted: boolean,
  ): Promise<OpenGap[]> {
    const keys = this.names.index(scope);
    const reply = await this.scripts['rsq-gaps'](
      [keys.gaps, keys.records],
      [this.clock.stamp(openedBefore), limit, includeAlerted ? 1 : 0],
    );
    return interpretGaps(reply, { operation: 'listGaps', scope });
  }

  /** The scope's open gaps whose key is in the last tenth of its retention at `now`. */
  async expiring(scope: string, now: number, limit: number): Promise<ExpiringGap[]> {
    const keys = this.names.index(scope);
    const reply = await this.scripts['rsq-expiring'](
      [keys.gaps, keys.records, keys.activity],
      [this.clock.stamp(now), this.retentionMs, limit],
    );
    return interpretExpiringGaps(reply, { operation: 'listExpiringGaps', scope });
  }

  /** The scope's open gaps and the oldest one's age at `now`, after pruning expired records. */
  async gapStats(scope: string, now: number): Promise<GapStats> {
    const reply = await this.scripts['rsq-gap-stats'](indexKeyList(this.names.index(scope)), [
      this.clock.stamp(now),
      this.retentionMs,
      PRUNE_ON_DEMAND_BATCH,
    ]);
    const [openGaps, oldestGapAgeMs] = Array.isArray(reply) ? (reply as unknown[]) : [];
    if (
      !Number.isSafeInteger(openGaps) ||
      !Number.isSafeInteger(oldestGapAgeMs) ||
      (openGaps as number) < 0
    ) {
      throw new RedisResequencerStoreError(
        'rsq-gap-stats',
        scope,
        undefined,
        `the script answered ${JSON.stringify(reply)}; deploy the library's lua/ files with its code`,
      );
    }
    return (oldestGapAgeMs as number) < 0
      ? { openGaps: openGaps as number }
      : { openGaps: openGaps as number, oldestGapAgeMs: oldestGapAgeMs as number };
  }

  async stalled(scope: string, idleSince: number, limit: number): Promise<string[]> {
    const keys = this.names.index(scope);
    const until = await this.clock.onRedisClock(idleSince);
    return this.redis.zrangebyscore(keys.stalled, '-inf', until, 'LIMIT', 0, limit);
  }

  remember(scope: string, value: ScopeTotals): void {
    this.totals.set(scope, { value, seenAt: Date.now(), seen: ++this.seen });
  }

  private totalsOf(reply: unknown, script: string, scope: string): ScopeTotals {
    const totals = scopeTotals(reply);
    if (totals) return totals;
    throw new RedisResequencerStoreError(
      script,
      scope,
      undefined,
      `the script answered ${JSON.stringify(reply)}; deploy the library's lua/ files with its code`,
    );
  }
}

/** The field of a scope's records hash that holds its buffered bytes (see lua/_rsq-index.lua). */
const BYTES_FIELD = '';
