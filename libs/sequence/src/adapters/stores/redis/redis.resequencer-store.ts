/*
 * The Redis resequencer store, and the protocol that keeps it correct on Redis Cluster.
 *
 * Keys (see RedisResequencerKeys): per resequencer key, a state hash, a buffer (sorted set,
 * score = sequence, member = the encoded entry) and a hand-off list, under one hash tag
 * `{rsq:<scope>:<key>}`; per scope, an index under `{rsq-idx:<scope>}`: a record per key
 * ("ver:buffered:next:lowest:bytes"), the open gaps (key -> gapSince; gapSince + 2^50 once alerted), the non-empty
 * hand-off lists (key -> handOffAt), the keys' last activity, and the scope's buffered totals.
 *
 * Every port method on a key is ONE Lua script over that key's keys (atomic, single-slot). No
 * script can also update the scope index, which lives in another slot, so a change runs in two
 * steps:
 *   1. the per-key script changes the key, raises its `ver` (to max(ver + 1, now): it keeps
 *      growing across a key that expired and came back) and returns the key's index record;
 *   2. the index script applies the record unless the index holds a newer ver (idempotent, and
 *      order-safe when two instances' steps interleave), updating gaps, stalled hand-offs and
 *      the total, and returns the total. The port method resolves once both are done.
 * An instance that dies between the steps leaves the index stale for that key (a gap not
 * listed, a total off) until the key's next script: `accept` returns the record on every
 * outcome that changes the index, and on duplicate and late outcomes of a key the index holds,
 * so the redelivery of the message whose ack was lost repairs it; a claim that finds an empty
 * hand-off list (the sweeper's, a waiter's) returns the key's record too, which repairs an entry
 * left by a lost step after the list emptied. listGaps and listStalledHandOffs may thus name a
 * key whose state moved on; the per-key scripts re-check everything (resolveGap answers 'none',
 * claimDrain 'empty'). On a single node (no Cluster) the changing scripts run as their '-ix'
 * variants, which apply step 2 inline: one round trip, and no window between the steps. There,
 * too, the accepts (and the settles) made in one turn of the event loop go in one call
 * (rsq-accept-batch, rsq-settle-batch), each taken as its own -ix call would take it.
 *
 * maxBufferedTotal and maxBufferedBytesTotal: the accept script cannot read the scope totals
 * (another slot). The caller passes the totals it last saw (from the last index step of this
 * instance, or a read at most TOTAL_MAX_AGE_MS old) and the script refuses to buffer past them. Events
 * accepted by other instances within that window are not seen: the bound may be overshot by
 * as many events as the instances buffer in ~100 ms (the accepts of one batch call are checked
 * against the totals the ones before them left). Before a refusal stands, the store prunes
 * the records of expired keys (rsq-prune) and asks again with the total that is left.
 *
 * Retention: a key expires retentionMs after its last change, by the `now` the callers pass
 * (a script that finds it expired deletes it and starts afresh; the index step prunes expired
 * records, taking their events off the total) and in real time (the key's keys live at least
 * retentionMs after its last change, the index keys retentionMs + keyTtlMarginMs after the
 * scope's: lua/_resequencer.lua and lua/_rsq-index.lua renew the TTLs lazily), the safety net
 * for keys and scopes nobody comes back to. A retired key (`retire`) expires at its retirement's
 * end, both ways, and leaves the index at once (rsq-retire; rsq-unindex on Redis Cluster); a
 * claim or gap resolution that finds it retired drops its index entries again, which a step the
 * retirement overtook (another instance's) may have put back.
 *
 * Clocks: every time a caller passes (now, openedBefore, idleSince) goes to the scripts with the
 * caller's clock reading, and runs on Redis's clock when that clock is more than 1 s off
 * (lua/_clock.lua): drain leases and gap ages hold whatever an instance's clock says.
 *
 * Redis unavailable: every method rejects with the client's error (after the ioredis client's
 * own retries); the resequencer requeues the message, having acked nothing.
 */
import { randomUUID } from 'node:crypto';
import type { RedisOptions } from 'ioredis';
import { isCluster, connectOwned, quitRedisClient } from './redis-client';
import { checkOptionKeys, type OptionKeysOf } from '../../../core/option-keys';
import {
  assertResequencerArguments,
  type AcceptContext,
  type AcceptOutcome,
  type DrainClaim,
  type DrainContext,
  type DrainSettlement,
  type ExpiringGap,
  type GapPolicy,
  type GapResolution,
  type GapResolveContext,
  type GapStats,
  type OpenGap,
  type ResequencedEntry,
  type ResequencerKey,
  type ResequencerKeyState,
  type ResequencerStore,
} from '../../../ports/resequencer-store.port';
import {
  assertLimits,
  assertDrainArguments,
  assertGapPolicy,
  assertHolder,
  assertPositiveInteger,
  assertScope,
  assertStart,
  assertTime,
} from '../../../ports/resequencer-store.arguments';
import { encodeEntry, type EntrySealing } from './redis-resequencer.codec';
import { BodyCipher, type StoreEncryptionOptions } from '../../../core/body-cipher';
import { SealedBufferFailure } from '../../../core/sealed-buffer';
import { openEntry, sealEntry, undecryptableDetail } from '../sealed-entry';
import { clockProblem, RedisClock } from './redis-clock';
import { RedisResequencerIndex } from './redis-resequencer-index';
import { RedisResequencerStoreError } from './redis-resequencer-store.error';
import { indexKeyList, keyKeyList, RedisResequencerKeys } from './redis-resequencer-keys';
import {
  interpretAccept,
  interpretClaim,
  interpretInspect,
  interpretResolve,
  interpretSettle,
  type ReplySource,
  type ScopeTotals,
  type WithRecord,
} from './redis-resequencer-replies';
import { loadScripts, type RedisClient, type ScriptArgument, type Scripts } from './redis-scripts';
import { withCoalescedWrites } from './redis-command-writes';
import { TickBatches } from './redis-tick-batches';
import { socketTricksEnabled, unsafeSocketTricksProblem } from '../../socket-tricks.guard';
import { checkInteger } from '../../../core/option-checks';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

export interface RedisResequencerStoreOptions {
  /**
   * Prepended to every key; without `{` or `}`.
   * @default 'nseq'
   */
  readonly prefix?: string;
  /**
   * How long a key's records live after its last change (and a scope's index after the last
   * change of any of its keys): an abandoned key cannot leak memory; a key accepted again after
   * that starts from `start`.
   * @default 604_800_000 (7 days)
   */
  readonly retentionMs?: number;
  /**
   * How much longer than the keys they index the scope index keys live in real time, so that
   * an index never vanishes before the keys it accounts for.
   * @default 60_000
   */
  readonly keyTtlMarginMs?: number;
  /**
   * Corks the client's socket from the store's first script call in a turn of the event loop to
   * the end of that turn, so the scripts of a batch of deliveries leave in one `writev` instead of
   * one system call, and one wake-up of Redis, each. Same commands, same order, same replies. In
   * the resequencer benchmark it cut the CPU spent per event (docs/benchmarks.md). Not on Redis
   * Cluster.
   *
   * It relies on ioredis's internals (its client's socket, `stream`), written for ioredis 5.x: on
   * any other version the store logs a warning and leaves it off. Off, the store uses ioredis's
   * public API only.
   * @default false
   */
  readonly unsafeSocketTricks?: boolean;
  /**
   * This machine's clock, which the `now` of the store's callers is read from. Drain leases and
   * gap deadlines run on Redis's clock whenever this one is more than 1 s away from it (see
   * "Clocks" in docs/configuration.md); a test gives an instance a skewed clock here.
   * @default Date.now
   */
  readonly clock?: () => number;
  /**
   * Keeps every event's body and headers AES-256-GCM encrypted in Redis, bound to its key and
   * sequence (see docs/security.md); the byte bounds count the plaintext. An event that does not
   * decrypt is dead-lettered `integrity-mismatch`, never delivered.
   * @default none
   */
  readonly encryption?: StoreEncryptionOptions;
}

const REDIS_RESEQUENCER_STORE_KEYS = {
  prefix: true,
  retentionMs: true,
  keyTtlMarginMs: true,
  unsafeSocketTricks: true,
  clock: true,
  encryption: true,
} as const satisfies OptionKeysOf<RedisResequencerStoreOptions>;
const WHERE = 'RedisResequencerStore options';

/**
 * {@link ResequencerStore} on Redis (single node or Cluster), shared by any number of consumer
 * instances. See the top of this file for the key layout and the two-step index protocol.
 *
 * @example
 * const store = new RedisResequencerStore(new Redis(process.env.REDIS_URL), { prefix: 'orders' });
 */
export class RedisResequencerStore implements ResequencerStore {
  readonly name = 'redis';

  private readonly keys: RedisResequencerKeys;
  private readonly scripts: Scripts;
  private readonly index: RedisResequencerIndex;
  private readonly clock: RedisClock;
  private readonly retentionMs: number;
  /** On Redis Cluster the index step is a second script (another slot); on one node, inline. */
  private readonly isCluster: boolean;
  private readonly cipher?: BodyCipher;
  /** On a single node, the accepts of one turn of the event loop, per scope and bounds. */
  private readonly acceptBatches = new TickBatches<BatchedAccept, unknown>(
    ACCEPT_BATCH_MAX,
    (items) => this.acceptBatch(items),
  );
  /** On a single node, the settles of one turn of the event loop, per scope. */
  private readonly settleBatches = new TickBatches<BatchedSettle, unknown>(
    ACCEPT_BATCH_MAX,
    (items) => this.settleBatch(items),
  );
  private ownsClient = false;

  constructor(
    private readonly redis: RedisClient,
    options: RedisResequencerStoreOptions = {},
  ) {
    this.keys = new RedisResequencerKeys(options.prefix ?? 'nseq');
    this.retentionMs = options.retentionMs ?? 604_800_000;
    const marginMs = options.keyTtlMarginMs ?? 60_000;
    const problems: string[] = [];
    checkOptionKeys(problems, options, REDIS_RESEQUENCER_STORE_KEYS);
    checkInteger(problems, 'retentionMs', this.retentionMs, 1);
    checkInteger(problems, 'keyTtlMarginMs', marginMs, 0);
    const tricks = unsafeSocketTricksProblem(options.unsafeSocketTricks);
    if (tricks) problems.push(tricks);
    const clock = clockProblem(options.clock);
    if (clock) problems.push(clock);
    if (problems.length > 0) throw new SequenceOptionsError(WHERE, problems);
    if (options.encryption !== undefined) {
      this.cipher = new BodyCipher(options.encryption, 'RedisResequencerStore encryption');
    }
    const scripts = loadScripts(redis);
    this.scripts = socketTricksEnabled(
      options.unsafeSocketTricks ?? false,
      'ioredis',
      'RedisResequencerStore',
    )
      ? withCoalescedWrites(redis, scripts)
      : scripts;
    this.isCluster = isCluster(redis);
    this.clock = new RedisClock(this.scripts, options.clock);
    this.index = new RedisResequencerIndex(
      redis,
      this.scripts,
      this.keys,
      this.retentionMs,
      marginMs,
      this.clock,
    );
  }

  /** A store with a client of its own, which `close()` quits. */
  static connect(
    url: string,
    options: RedisResequencerStoreOptions & { readonly redis?: RedisOptions } = {},
  ): RedisResequencerStore {
    return connectOwned(url, options, WHERE, REDIS_RESEQUENCER_STORE_KEYS, (client, own) => {
      const store = new RedisResequencerStore(client, own);
      store.ownsClient = true;
      return store;
    });
  }

  async accept(
    key: ResequencerKey,
    entry: ResequencedEntry,
    context: AcceptContext,
  ): Promise<AcceptOutcome> {
    assertResequencerArguments(key, entry.seq);
    assertStart(context.start);
    assertLimits(context.limits);
    if (context.drain) assertDrainArguments(key, { ...context.drain, now: context.now });
    const encoded = encodeEntry(entry, this.sealingOf(key));
    const outcome = await this.acceptOnce(
      key,
      entry.seq,
      encoded,
      context,
      await this.index.recentTotals(key.scope),
    );
    if (
      outcome.kind !== 'full' ||
      (outcome.limit !== 'maxBufferedTotal' && outcome.limit !== 'maxBufferedBytesTotal')
    ) {
      return outcome;
    }
    // The totals it was refused for may count keys that have expired since (index steps prune
    // them only now and then), or be up to TOTAL_MAX_AGE_MS old. A refusal changed nothing: prune,
    // and ask once more with the totals that are left.
    const totals = await this.index.prune(key.scope, context.now);
    const { maxBufferedTotal, maxBufferedBytesTotal } = context.limits;
    if (totals.events >= maxBufferedTotal) return outcome;
    if (maxBufferedBytesTotal !== undefined && totals.bytes >= maxBufferedBytesTotal) {
      return outcome;
    }
    return this.acceptOnce(key, entry.seq, encoded, context, totals);
  }

  async claimDrain(key: ResequencerKey, context: DrainContext): Promise<DrainClaim> {
    assertDrainArguments(key, context);
    const reply = await this.scripts['rsq-claim'](keyKeyList(this.keys.of(key)), [
      this.clock.stamp(context.now),
      context.holder,
      context.leaseMs,
      context.limit,
      this.retentionMs,
    ]);
    // 'empty' brings the key's record: it repairs an index entry a crash left stale.
    return this.indexed(
      key,
      interpretClaim(reply, source('claimDrain', key, this.sealingOf(key))),
      context.now,
    );
  }

  async settleDrain(
    key: ResequencerKey,
    count: number,
    context: DrainContext,
  ): Promise<DrainSettlement> {
    assertDrainArguments(key, context);
    assertPositiveInteger('count', count);
    // The settle token: a resent call (ioredis, after a reconnect) trims once.
    const settle: BatchedSettle = { key, count, context, token: randomUUID() };
    const reply = this.isCluster
      ? await this.settleAlone(settle)
      : await this.settleBatches.add(
          JSON.stringify([key.scope, context.leaseMs, context.limit]),
          settle,
        );
    return this.indexed(
      key,
      interpretSettle(reply, source('settleDrain', key, this.sealingOf(key))),
      context.now,
    );
  }

  /** One settle, one script call: rsq-settle-ix on a single node, rsq-settle on Redis Cluster. */
  private settleAlone({ key, count, context, token }: BatchedSettle): Promise<unknown> {
    return this.perKey('rsq-settle', key, context.now, [
      this.clock.stamp(context.now),
      context.holder,
      count,
      context.leaseMs,
      context.limit,
      this.retentionMs,
      token,
    ]);
  }

  /**
   * The settles of one turn in one scope (drains whose confirms came in together), on a single
   * node: one rsq-settle-batch call, each answered as its own rsq-settle-ix call would be. A lone
   * settle goes as rsq-settle-ix; when the batch call fails, each is tried alone (its token keeps
   * one the failed call applied from trimming again).
   */
  private async settleBatch(
    items: readonly BatchedSettle[],
  ): Promise<PromiseSettledResult<unknown>[]> {
    const alone = () => Promise.allSettled(items.map((item) => this.settleAlone(item)));
    if (items.length === 1) return alone();
    const { key: first, context } = items[0];
    const keys = indexKeyList(this.keys.index(first.scope));
    const args: ScriptArgument[] = [
      context.leaseMs,
      context.limit,
      this.retentionMs,
      ...this.index.batchArguments(),
    ];
    for (const item of items) {
      keys.push(...keyKeyList(this.keys.of(item.key)));
      args.push(
        item.key.key,
        this.clock.stamp(item.context.now),
        item.context.holder,
        item.count,
        item.token,
      );
    }
    return this.batchReplies('rsq-settle-batch', first.scope, items.length, () =>
      this.scripts['rsq-settle-batch'](keys, args),
    ).then((replies) => replies ?? alone());
  }

  async renewDrain(
    key: ResequencerKey,
    holder: string,
    leaseMs: number,
    now: number,
  ): Promise<boolean> {
    assertResequencerArguments(key);
    assertHolder(holder);
    assertPositiveInteger('leaseMs', leaseMs);
    assertTime('now', now);
    const reply = await this.scripts['rsq-renew'](
      [this.keys.of(key).state],
      [holder, this.clock.stamp(now), leaseMs],
    );
    return reply === 1;
  }

  async releaseDrain(key: ResequencerKey, holder: string): Promise<void> {
    assertResequencerArguments(key);
    assertHolder(holder);
    await this.scripts['rsq-release']([this.keys.of(key).state], [holder]);
  }

  async listGaps(
    scope: string,
    openedBefore: number,
    limit: number,
    includeAlerted = false,
  ): Promise<OpenGap[]> {
    assertScope(scope);
    assertTime('openedBefore', openedBefore);
    assertPositiveInteger('limit', limit);
    return this.index.gaps(scope, openedBefore, limit, includeAlerted);
  }

  async listExpiringGaps(scope: string, now: number, limit: number): Promise<ExpiringGap[]> {
    assertScope(scope);
    assertTime('now', now);
    assertPositiveInteger('limit', limit);
    return this.index.expiring(scope, now, limit);
  }

  async gapStats(scope: string, now: number): Promise<GapStats> {
    assertScope(scope);
    assertTime('now', now);
    return this.index.gapStats(scope, now);
  }

  async resolveGap(
    key: ResequencerKey,
    policy: GapPolicy,
    context: GapResolveContext,
  ): Promise<GapResolution> {
    assertResequencerArguments(key);
    assertGapPolicy(policy);
    assertTime('openedBefore', context.openedBefore);
    const { unchangedSince } = context;
    if (unchangedSince !== undefined) assertTime('unchangedSince', unchangedSince);
    const reply = await this.perKey('rsq-resolve', key, context.now, [
      this.clock.stamp(context.now),
      policy,
      this.clock.stamp(context.openedBefore),
      this.retentionMs,
      // As listExpiringGaps reported it: a stored time, not a caller's clock reading.
      unchangedSince ?? '',
      context.close ? 1 : 0,
    ]);
    return this.indexed(
      key,
      interpretResolve(reply, source('resolveGap', key, this.sealingOf(key)), policy),
      context.now,
    );
  }

  async listStalledHandOffs(scope: string, idleSince: number, limit: number): Promise<string[]> {
    assertScope(scope);
    assertTime('idleSince', idleSince);
    assertPositiveInteger('limit', limit);
    return this.index.stalled(scope, idleSince, limit);
  }

  /**
   * On a single node one script (rsq-retire-ix) retires the key and drops its index record; on
   * Redis Cluster rsq-retire, then rsq-unindex in the index's slot.
   */
  async retire(key: ResequencerKey, retainMs: number, now: number): Promise<boolean> {
    assertResequencerArguments(key);
    assertPositiveInteger('retainMs', retainMs);
    assertTime('now', now);
    const keys = keyKeyList(this.keys.of(key));
    const index = indexKeyList(this.keys.index(key.scope));
    const args = [this.clock.stamp(now), retainMs, this.retentionMs];
    const reply = this.isCluster
      ? await this.scripts['rsq-retire'](keys, args)
      : await this.scripts['rsq-retire-ix']([...keys, ...index], [...args, key.key]);
    const [retired, ver] = Array.isArray(reply) ? (reply as unknown[]) : [];
    if ((retired !== 0 && retired !== 1) || !Number.isSafeInteger(ver)) {
      throw new RedisResequencerStoreError(
        'rsq-retire',
        key.scope,
        key.key,
        `the script answered ${JSON.stringify(reply)}; deploy the library's lua/ files with its code`,
      );
    }
    if (retired === 1 && this.isCluster) {
      // The key is retired whatever happens here: a record this leaves is repaired by the next
      // claim or gap resolution of the key (see repairRecord in lua/_resequencer.lua), or pruned
      // with the key's retention. The failure is not the caller's: the key's state does expire.
      await this.index.unindex(key.scope, key.key, ver as number).catch(() => undefined);
    }
    return retired === 1;
  }

  async inspect(key: ResequencerKey, start: number): Promise<ResequencerKeyState> {
    assertResequencerArguments(key);
    assertStart(start);
    const reply = await this.scripts['rsq-inspect'](keyKeyList(this.keys.of(key)), []);
    return interpretInspect(reply, source('inspect', key, this.sealingOf(key)), start);
  }

  async bufferedTotal(scope: string): Promise<number> {
    assertScope(scope);
    return (await this.index.read(scope)).events;
  }

  async bufferedBytes(scope: string): Promise<number> {
    assertScope(scope);
    return (await this.index.read(scope)).bytes;
  }

  async ping(): Promise<void> {
    await this.redis.ping();
  }

  /** Quits the client when `connect` created it; a client passed in stays the caller's. */
  async close(): Promise<void> {
    if (!this.ownsClient) return;
    this.ownsClient = false;
    await quitRedisClient(this.redis);
  }

  private async acceptOnce(
    key: ResequencerKey,
    seq: number,
    encoded: string,
    context: AcceptContext,
    seen: ScopeTotals,
  ): Promise<AcceptOutcome> {
    const reply = this.isCluster
      ? await this.acceptAlone(key, seq, encoded, context, seen)
      : await this.acceptBatches.add(batchGroup(key.scope, context, seen), {
          key,
          seq,
          encoded,
          context,
          seen,
        });
    return this.indexed(
      key,
      interpretAccept(reply, source('accept', key, this.sealingOf(key))),
      context.now,
    );
  }

  /** One accept, one script call: rsq-accept-ix on a single node, rsq-accept on Redis Cluster. */
  private acceptAlone(
    key: ResequencerKey,
    seq: number,
    encoded: string,
    context: AcceptContext,
    seen: ScopeTotals,
  ): Promise<unknown> {
    return this.perKey('rsq-accept', key, context.now, [
      this.clock.stamp(context.now),
      context.start,
      seq,
      encoded,
      context.limits.maxBufferedPerKey,
      context.limits.maxBufferedTotal,
      seen.events,
      this.retentionMs,
      context.drain?.holder ?? '',
      context.drain?.leaseMs ?? 0,
      context.drain?.limit ?? 0,
      context.limits.maxBufferedBytesPerKey ?? 0,
      context.limits.maxBufferedBytesTotal ?? 0,
      seen.bytes,
      context.limits.maxSeqAhead ?? 0,
    ]);
  }

  /**
   * The accepts of one turn that share a scope and bounds (see {@link batchGroup}), on a single
   * node: one rsq-accept-batch call for them all, each answered as its own rsq-accept-ix call
   * would be. A lone accept goes as rsq-accept-ix. When the batch call fails (Redis unreachable,
   * or a script error on one event), each is tried alone, so that it fails or succeeds on its own:
   * events the failed call took come back as duplicates or late, which is what their redelivery
   * would answer.
   */
  private async acceptBatch(
    items: readonly BatchedAccept[],
  ): Promise<PromiseSettledResult<unknown>[]> {
    const alone = () =>
      Promise.allSettled(
        items.map(({ key, seq, encoded, context, seen }) =>
          this.acceptAlone(key, seq, encoded, context, seen),
        ),
      );
    if (items.length === 1) return alone();
    const { key: first, context, seen } = items[0];
    const keys = indexKeyList(this.keys.index(first.scope));
    const args: ScriptArgument[] = [
      context.start,
      context.limits.maxBufferedPerKey,
      context.limits.maxBufferedTotal,
      seen.events,
      this.retentionMs,
      context.drain?.leaseMs ?? 0,
      context.drain?.limit ?? 0,
      context.limits.maxBufferedBytesPerKey ?? 0,
      context.limits.maxBufferedBytesTotal ?? 0,
      seen.bytes,
      ...this.index.batchArguments(),
      context.limits.maxSeqAhead ?? 0,
    ];
    for (const item of items) {
      keys.push(...keyKeyList(this.keys.of(item.key)));
      args.push(
        item.key.key,
        this.clock.stamp(item.context.now),
        item.seq,
        item.encoded,
        item.context.drain?.holder ?? '',
      );
    }
    const replies = await this.batchReplies('rsq-accept-batch', first.scope, items.length, () =>
      this.scripts['rsq-accept-batch'](keys, args),
    );
    return replies ?? alone();
  }

  /**
   * A batch script's replies, one per item, as settled results; undefined when the call failed,
   * and each item is to be tried alone. A reply of another shape fails every item.
   */
  private async batchReplies(
    script: 'rsq-accept-batch' | 'rsq-settle-batch',
    scope: string,
    count: number,
    call: () => Promise<unknown>,
  ): Promise<PromiseSettledResult<unknown>[] | undefined> {
    let replies: unknown;
    try {
      replies = await call();
    } catch {
      return undefined;
    }
    if (!Array.isArray(replies) || replies.length !== count) {
      const error = new RedisResequencerStoreError(
        script,
        scope,
        undefined,
        `the script answered ${JSON.stringify(replies)?.slice(0, 200)}; deploy the library's lua/ files with its code`,
      );
      return Array.from({ length: count }, () => ({ status: 'rejected', reason: error }));
    }
    return replies.map((value: unknown) => ({ status: 'fulfilled', value }));
  }

  /**
   * Runs a per-key script that changes the key: on a single node its "-ix" variant, which applies
   * the index record inline (one round trip); on Redis Cluster the plain one, whose record
   * {@link indexed} then applies in a second step.
   */
  private perKey(
    script: 'rsq-accept' | 'rsq-settle' | 'rsq-resolve',
    key: ResequencerKey,
    now: number,
    args: readonly ScriptArgument[],
  ): Promise<unknown> {
    const keys = keyKeyList(this.keys.of(key));
    if (this.isCluster) return this.scripts[script](keys, args);
    return this.scripts[`${script}-ix`](
      [...keys, ...indexKeyList(this.keys.index(key.scope))],
      [...args, ...this.index.inlineArguments(key.key, now)],
    );
  }

  /** How `key`'s entries are kept when the store encrypts (see redis-resequencer.codec.ts). */
  private sealingOf(key: ResequencerKey): EntrySealing | undefined {
    const cipher = this.cipher;
    if (!cipher) return undefined;
    return {
      seal: (entry) => sealEntry(cipher, key, entry),
      open: (seq, sealed) => {
        if (sealed === undefined)
          return { undecryptable: undecryptableDetail(key, seq, 'not-sealed') };
        const entry = openEntry(cipher, key, seq, sealed);
        return entry instanceof SealedBufferFailure
          ? { undecryptable: undecryptableDetail(key, seq, entry) }
          : entry;
      },
    };
  }

  /** Step 2 of every change: the key's record into its scope's index (see the top of the file). */
  private async indexed<T>(key: ResequencerKey, step: WithRecord<T>, now: number): Promise<T> {
    if (step.totals) this.index.remember(key.scope, step.totals);
    else if (step.record) await this.index.apply(key.scope, key.key, step.record, now);
    else if (step.retiredVer !== undefined) {
      await this.index.unindex(key.scope, key.key, step.retiredVer);
    }
    return step.result;
  }
}

/** The most accepts (or settles) one batch call takes (a script blocks Redis while it runs). */
const ACCEPT_BATCH_MAX = 64;

/** An accept waiting for its turn's batch. */
interface BatchedAccept {
  readonly key: ResequencerKey;
  readonly seq: number;
  readonly encoded: string;
  readonly context: AcceptContext;
  readonly seen: ScopeTotals;
}

/** A settle waiting for its turn's batch. */
interface BatchedSettle {
  readonly key: ResequencerKey;
  readonly count: number;
  readonly context: DrainContext;
  readonly token: string;
}

/** Accepts batch together when all that the script takes once per call is the same for them. */
function batchGroup(scope: string, context: AcceptContext, seen: ScopeTotals): string {
  const { limits, drain } = context;
  return JSON.stringify([
    scope,
    context.start,
    limits.maxBufferedPerKey,
    limits.maxBufferedTotal,
    limits.maxBufferedBytesPerKey ?? 0,
    limits.maxBufferedBytesTotal ?? 0,
    limits.maxSeqAhead ?? 0,
    drain?.leaseMs ?? 0,
    drain?.limit ?? 0,
    seen.events,
    seen.bytes,
  ]);
}

function source(operation: string, key: ResequencerKey, sealing?: EntrySealing): ReplySource {
  return { operation, scope: key.scope, key: key.key, sealing };
}
