import { channelBudget } from '../../../core/completeness';
import type { SequenceLimits, SequenceStoreStats } from '../../../ports/sequence-store.port';
import { globalKeyList, type RedisKeys } from './redis-keys';
import { RedisClock } from './redis-clock';
import type { RedisClient, Scripts } from './redis-scripts';

/** Budget bytes granted to one sequence's record, under the record's epoch. */
export interface Grant {
  readonly epoch: number;
  readonly bytes: number;
  /** Unique: the sequence records the grants it consumed, so a resent call cannot reuse one. */
  readonly id: number;
}

export const NO_GRANT: Grant = { epoch: 0, bytes: 0, id: 0 };

/** What a per-sequence script reports for the global index after a change. */
export interface Settlement {
  readonly epoch: number;
  readonly ver: number;
  readonly storedBytes: number;
  readonly firstAt: number;
  readonly dueAt: number;
  /** Budget bytes of a grant the sequence did not use. */
  readonly refund: number;
  /** TTL of the sequence's keys: the global keys must live at least as long. */
  readonly keyTtl: number;
}

export type Reservation =
  | { readonly kind: 'granted'; readonly grant: Grant }
  | { readonly kind: 'backpressure'; readonly limit: BackpressureLimit }
  | { readonly kind: 'evict'; readonly victims: ReadonlyArray<{ member: string; until: number }> };

type BackpressureLimit = 'maxBufferedBytes' | 'maxChannelBufferedBytes' | 'maxOpenSequences';

/** Failed sequences' kept fragments evicted per round before answering back-pressure. */
const EVICTION_BATCH = 16;

/**
 * The store-wide half of the Redis sequence store: budget records, the due-time index, stats.
 * Every key here shares the hash tag `{idx}` (one slot); the protocol that ties these records
 * to the per-sequence keys is described in redis.sequence-store.ts.
 */
export class RedisBudget {
  private readonly keys: string[];

  constructor(
    private readonly redis: RedisClient,
    private readonly scripts: Scripts,
    private readonly names: RedisKeys,
    /** Added to every TTL given: the global keys outlive the sequence keys they account for. */
    private readonly marginMs: number,
    /** Stamps the callers' times for the scripts, which put them on Redis's clock. */
    private readonly clock = new RedisClock(scripts),
  ) {
    this.keys = globalKeyList(names.global);
  }

  /** Grants `increase` budget bytes to the sequence's record, creating it if need be. */
  async reserve(
    member: string,
    increase: number,
    context: { now: number; provisionalDue: number; limits: SequenceLimits; ttl: number },
  ): Promise<Reservation> {
    const reply = (await this.scripts.reserve(this.keys, [
      member,
      increase,
      this.clock.stamp(context.now),
      this.clock.stamp(context.provisionalDue),
      context.limits.maxOpenSequences,
      context.limits.maxBufferedBytes,
      context.ttl + this.marginMs,
      EVICTION_BATCH,
      channelBudget(context.limits),
    ])) as [string, ...unknown[]];
    switch (reply[0]) {
      case 'granted':
        return {
          kind: 'granted',
          grant: { epoch: Number(reply[1]), bytes: Number(reply[2]), id: Number(reply[3]) },
        };
      case 'backpressure':
        return { kind: 'backpressure', limit: reply[1] as BackpressureLimit };
      case 'evict': {
        const flat = reply[1] as string[];
        const victims: Array<{ member: string; until: number }> = [];
        for (let i = 0; i < flat.length; i += 2) {
          victims.push({ member: flat[i], until: Number(flat[i + 1]) });
        }
        return { kind: 'evict', victims };
      }
      default:
        throw new Error(`reserve script answered ${String(reply[0])}`);
    }
  }

  async settle(member: string, settlement: Settlement): Promise<void> {
    await this.scripts.settle(this.keys, [
      member,
      settlement.epoch,
      settlement.ver,
      settlement.storedBytes,
      settlement.firstAt,
      settlement.dueAt,
      settlement.refund,
      settlement.keyTtl + this.marginMs,
    ]);
  }

  /** Removes the record if it is still of `epoch`; records fragments a failed finish keeps. */
  async forget(
    member: string,
    epoch: number,
    ttl: number,
    retained?: { until: number; bytes: number },
  ): Promise<void> {
    await this.scripts.forget(this.keys, [
      member,
      epoch,
      retained?.until ?? 0,
      retained?.bytes ?? 0,
      ttl + this.marginMs,
    ]);
  }

  async releaseRetained(member: string, until: number): Promise<void> {
    await this.scripts['release-retained'](this.keys, [member, until]);
  }

  /** The record's epoch, or undefined when the index holds no record for the sequence. */
  async epochOf(member: string): Promise<number | undefined> {
    const raw = await this.redis.hget(this.names.global.open, member);
    return raw === null ? undefined : Number(raw.split(':')[0]);
  }

  async due(now: number, limit: number): Promise<string[]> {
    if (limit <= 0) return [];
    const until = await this.clock.onRedisClock(now);
    return this.redis.zrangebyscore(this.names.global.due, '-inf', until, 'LIMIT', 0, limit);
  }

  async retentionsOver(
    now: number,
    limit: number,
  ): Promise<Array<{ member: string; until: number }>> {
    const flat = await this.redis.zrangebyscore(
      this.names.global.retention,
      '-inf',
      await this.clock.onRedisClock(now),
      'WITHSCORES',
      'LIMIT',
      0,
      limit,
    );
    const over: Array<{ member: string; until: number }> = [];
    for (let i = 0; i < flat.length; i += 2) {
      over.push({ member: flat[i], until: Number(flat[i + 1]) });
    }
    return over;
  }

  async stats(now: number): Promise<SequenceStoreStats> {
    const [openSequences, bufferedBytes, oldest, reservedBytes] = (await this.scripts.stats(
      this.keys,
      [this.clock.stamp(now)],
    )) as [number, string, string | null | false, string];
    const stats = {
      openSequences: Number(openSequences),
      bufferedBytes: Number(bufferedBytes),
      reservedBytes: Number(reservedBytes),
    };
    // No open sequence: Lua false, null over RESP2 (false over RESP3).
    return oldest === null || oldest === false ? stats : { ...stats, oldestOpenAt: Number(oldest) };
  }
}
