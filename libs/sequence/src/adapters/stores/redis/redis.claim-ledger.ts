import type { RedisOptions } from 'ioredis';
import { connectOwned, quitRedisClient } from './redis-client';
import { checkOptionKeys, type OptionKeysOf } from '../../../core/option-keys';
import {
  assertClaimArguments,
  type ClaimKey,
  type ClaimLedger,
  type ClaimOutcome,
  type Completion,
} from '../../../ports/claim-ledger.port';
import { RedisClaimKeys } from './redis-claim-keys';
import { clockProblem, RedisClock } from './redis-clock';
import { RedisClaimLedgerError } from './redis-claim-ledger.error';
import { loadScripts, type RedisClient, type Scripts } from './redis-scripts';
import { withCoalescedWrites } from './redis-command-writes';
import { socketTricksEnabled, unsafeSocketTricksProblem } from '../../socket-tricks.guard';
import { checkInteger } from '../../../core/option-checks';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';

export interface RedisClaimLedgerOptions {
  /**
   * Prepended to every key; without `{` or `}`.
   * @default 'nseq'
   */
  readonly prefix?: string;
  /**
   * How much longer than the ledger's logic needs them its keys live in real time: a lease key
   * `leaseMs` plus this, a completion key until its latest `retainUntil` plus this. It keeps a
   * caller whose clock runs behind the server's from seeing a record vanish early; records past
   * their time are already ignored by the logic, which runs on the `now` passed in.
   * @default 60_000
   */
  readonly keyTtlMarginMs?: number;
  /**
   * Corks the client's socket from the ledger's first script call in a turn of the event loop to
   * the end of that turn, so the calls of a batch of deliveries leave in one `writev` instead of
   * one system call each. Same commands, same order, same replies. Not on Redis Cluster.
   *
   * It relies on ioredis's internals (its client's socket, `stream`), written for ioredis 5.x: on
   * any other version the ledger logs a warning and leaves it off. Off, the ledger uses ioredis's
   * public API only.
   * @default false
   */
  readonly unsafeSocketTricks?: boolean;
  /**
   * This machine's clock, which the `now` of the ledger's callers is read from. Claims run on
   * Redis's clock whenever this one is more than 1 s away from it (see "Clocks" in
   * docs/configuration.md); a test gives an instance a skewed clock here.
   * @default Date.now
   */
  readonly clock?: () => number;
}

const REDIS_CLAIM_LEDGER_KEYS = {
  prefix: true,
  keyTtlMarginMs: true,
  unsafeSocketTricks: true,
  clock: true,
} as const satisfies OptionKeysOf<RedisClaimLedgerOptions>;
const WHERE = 'RedisClaimLedger options';

const CLAIM_OUTCOMES: ReadonlySet<unknown> = new Set<ClaimOutcome>(['claimed', 'done', 'busy']);

/**
 * {@link ClaimLedger} on Redis (single node or Cluster), shared by any number of consumer
 * instances. Each call is one Lua script over the keys of one ticket, which share a hash tag
 * (see `RedisClaimKeys` for the layout): atomic, single-slot, and every key it writes has
 * a TTL.
 *
 * Redis unavailable: every method rejects with the client's error (after the ioredis client's
 * own retries); the consumer then requeues the message, having run nothing.
 *
 * @example
 * const ledger = new RedisClaimLedger(new Redis(process.env.REDIS_URL), { prefix: 'imaging' });
 */
export class RedisClaimLedger implements ClaimLedger {
  readonly name = 'redis';

  private readonly keys: RedisClaimKeys;
  private readonly scripts: Scripts;
  private readonly clock: RedisClock;
  private readonly marginMs: number;
  private ownsClient = false;

  constructor(
    private readonly redis: RedisClient,
    options: RedisClaimLedgerOptions = {},
  ) {
    this.keys = new RedisClaimKeys(options.prefix ?? 'nseq');
    this.marginMs = options.keyTtlMarginMs ?? 60_000;
    const problems: string[] = [];
    checkOptionKeys(problems, options, REDIS_CLAIM_LEDGER_KEYS);
    checkInteger(problems, 'keyTtlMarginMs', this.marginMs, 0);
    const tricks = unsafeSocketTricksProblem(options.unsafeSocketTricks);
    if (tricks) problems.push(tricks);
    const clock = clockProblem(options.clock);
    if (clock) problems.push(clock);
    if (problems.length > 0) throw new SequenceOptionsError(WHERE, problems);
    const scripts = loadScripts(redis);
    this.scripts = socketTricksEnabled(
      options.unsafeSocketTricks ?? false,
      'ioredis',
      'RedisClaimLedger',
    )
      ? withCoalescedWrites(redis, scripts)
      : scripts;
    this.clock = new RedisClock(this.scripts, options.clock);
  }

  /** A ledger with a client of its own, which `close()` quits. */
  static connect(
    url: string,
    options: RedisClaimLedgerOptions & { readonly redis?: RedisOptions } = {},
  ): RedisClaimLedger {
    return connectOwned(url, options, WHERE, REDIS_CLAIM_LEDGER_KEYS, (client, own) => {
      const ledger = new RedisClaimLedger(client, own);
      ledger.ownsClient = true;
      return ledger;
    });
  }

  async claim(key: ClaimKey, holder: string, leaseMs: number, now: number): Promise<ClaimOutcome> {
    assertClaimArguments(key, holder, { leaseMs, now });
    const keys = this.keys.of(key);
    const reply = await this.scripts['claim-acquire'](
      [keys.done, keys.lease],
      [key.group, holder, this.clock.stamp(now), leaseMs, this.marginMs],
    );
    if (!CLAIM_OUTCOMES.has(reply)) throw new RedisClaimLedgerError('claim', key.ticket, reply);
    return reply as ClaimOutcome;
  }

  async complete(
    key: ClaimKey,
    holder: string,
    retainUntil: number,
    now: number,
  ): Promise<Completion> {
    assertClaimArguments(key, holder, { retainUntil, now });
    const keys = this.keys.of(key);
    const reply = await this.scripts['claim-complete'](
      [keys.done, keys.lease],
      [key.group, this.clock.stamp(retainUntil), this.clock.stamp(now), this.marginMs],
    );
    if (
      !Array.isArray(reply) ||
      typeof reply[0] !== 'number' ||
      (reply[1] !== 0 && reply[1] !== 1)
    ) {
      throw new RedisClaimLedgerError('complete', key.ticket, reply);
    }
    return { groups: reply[0], first: reply[1] === 1 };
  }

  async release(key: ClaimKey, holder: string): Promise<void> {
    assertClaimArguments(key, holder);
    await this.scripts['claim-release']([this.keys.of(key).lease], [holder]);
  }

  async ping(): Promise<void> {
    await this.redis.ping();
  }

  /** Quits the client when `connect` created it; a client passed in stays the caller's. */
  async close(): Promise<void> {
    if (!this.ownsClient) return;
    await quitRedisClient(this.redis);
  }
}
