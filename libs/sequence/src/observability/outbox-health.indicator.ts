import { Inject, Injectable, Optional } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import { withTimeout } from '../core/async';
import { OutboxRuntime } from '../outbox/outbox.runtime';
import {
  BOX_NAMES,
  type BoxName,
  type BoxStats,
  type OutboxStore,
} from '../ports/outbox-store.port';
import {
  probe,
  sharedHealthCall,
  type SequenceDependencyHealth,
  type SequenceHealthCheckOptions,
} from './sequence-health.indicator';
import {
  HEALTH_OPTIONS,
  resolveHealthOptions,
  type ResolvedHealthOptions,
  resolveHealthCheck,
} from './health.options';
import { formatMs, HealthVerdict, RUNBOOKS, type HealthFindings } from './health-verdict';

/** One box's records, as the outbox indicator reports them. */
export type BoxHealth = {
  readonly pending: number;
  /** `FAILED` records: they wait for an operator to retry or discard them. */
  readonly failed: number;
  /** Age of the oldest `PENDING` record in ms (the lag); absent when none is pending. */
  readonly lagMs?: number;
};

/**
 * The outbox's database, as the outbox indicator reports it: `'not-started'` when the application
 * has not used the outbox (no `outbox` options, no `@InboxHandler`, no call of `OutboxService`
 * yet), so that there is no store to check and the check opens none.
 */
export type OutboxStoreHealth =
  | SequenceDependencyHealth
  | { readonly name: string; readonly status: 'not-started'; readonly message: string };

// A type alias, not an interface: terminus takes the details as a `Record<string, unknown>`.
export type OutboxHealthDetails = {
  readonly store: OutboxStoreHealth;
  /**
   * Each box's (`outbox_events`, `outbox_commands`, `inbox_events`, `inbox_commands`) pending
   * and failed records and its lag. Left out when counting failed or took
   * longer than the timeout (the thresholds are then not judged).
   */
  readonly boxes?: Readonly<Record<BoxName, BoxHealth>>;
} & HealthFindings;

/**
 * `@nestjs/terminus` health indicator of the Outbox / Inbox: pings its database within a timeout,
 * and reports each box's pending and failed records and its lag (the age of the oldest pending
 * record). Down when the database does not answer, or when a threshold of
 * `SequenceHealthModule.forRoot` is passed (by default a lag over 5 minutes, or any failed
 * record): `tripped` names each with its value and limit. While the database is down nothing is
 * lost: commits fail for their callers, relays wait, and inbox messages are requeued.
 *
 * A check reads and starts nothing: an application that has not used the outbox (which then
 * starts at the first call of `OutboxService`) is reported up, its store `'not-started'`, rather
 * than have the check open an embedded database and start relays and the purge.
 *
 * @example
 * ```ts
 * check() {
 *   return this.health.check([() => this.outbox.isHealthy('outbox')]);
 * }
 * // { "outbox": { "status": "up", "store": { "name": "postgres", "status": "up" },
 * //   "boxes": { "outbox_events": { "pending": 3, "failed": 0, "lagMs": 420 },
 * //              "outbox_commands": { "pending": 0, "failed": 0 }, ... } } }
 * ```
 */
@Injectable()
export class OutboxHealthIndicator {
  private readonly thresholds: ResolvedHealthOptions;
  /**
   * The store as probed: one object, so that probes share its ping (see `sharedPing`); and each
   * box's counts, shared likewise: a count the timeout gave up on keeps its pool connection (or
   * SQLite's lock) until it ends, and a probe every few seconds must not pile more of them up.
   */
  private readonly store: { readonly name: string; ping(): Promise<void> };
  private readonly statsReaders = new WeakMap<OutboxStore, Map<BoxName, () => Promise<BoxStats>>>();

  constructor(
    private readonly health: HealthIndicatorService,
    private readonly runtime: OutboxRuntime,
    @Optional() @Inject(HEALTH_OPTIONS) thresholds?: ResolvedHealthOptions,
  ) {
    this.thresholds = thresholds ?? resolveHealthOptions();
    this.store = {
      // Named as the adapter, down or up; 'outbox store' only when the embedded one never opened.
      get name() {
        return runtime.storeName ?? 'outbox store';
      },
      ping: async () => (await runtime.current())?.ping(),
    };
  }

  private readStats(store: OutboxStore, box: BoxName): Promise<BoxStats> {
    let readers = this.statsReaders.get(store);
    if (!readers) {
      readers = new Map(BOX_NAMES.map((each) => [each, sharedHealthCall(() => store.stats(each))]));
      this.statsReaders.set(store, readers);
    }
    return readers.get(box)!();
  }

  async isHealthy<const Key extends string>(
    key: Key,
    options: SequenceHealthCheckOptions = {},
  ): Promise<HealthIndicatorResult<Key, 'up' | 'down', OutboxHealthDetails>> {
    const { timeoutMs, thresholds } = resolveHealthCheck(
      'OutboxHealthIndicator.isHealthy',
      options,
    );
    const indicator = this.health.check(key);
    const opened = this.runtime.current();
    if (!opened) {
      return indicator.up({
        store: {
          name: 'outbox store',
          status: 'not-started',
          message:
            'the outbox has not been used: no outbox options, no @InboxHandler, and no call of ' +
            'OutboxService yet; it starts at the first',
        },
      });
    }
    const store = await probe(this.store, timeoutMs);
    if (store.status === 'down') {
      return indicator.down({ store });
    }
    const ready = await opened;
    // The counts are details: counting slowly (a large table) or failing must neither hold the
    // probe past its timeout nor turn a database that answered into a failed check.
    const boxes = await withTimeout(
      Promise.all(
        BOX_NAMES.map(async (box) => [box, boxHealth(await this.readStats(ready, box))] as const),
      ),
      timeoutMs,
      () => new Error(`the box counts took over ${timeoutMs} ms`),
    ).then(
      (counts) => Object.fromEntries(counts) as Record<BoxName, BoxHealth>,
      () => undefined,
    );
    const verdict = new HealthVerdict(this.thresholds.warnRatio);
    if (boxes && thresholds) {
      for (const box of BOX_NAMES) this.judge(box, boxes[box], verdict);
    }
    const details: OutboxHealthDetails = {
      store: { ...store, name: ready.name },
      ...(boxes && { boxes }),
      ...verdict.findings(),
    };
    return verdict.down ? indicator.down(details) : indicator.up(details);
  }

  private judge(box: BoxName, health: BoxHealth, verdict: HealthVerdict): void {
    const side = box.startsWith('inbox') ? 'inbox' : 'outbox';
    const { lagMs, failed } = this.thresholds[side];
    if (health.lagMs !== undefined) {
      verdict.judge({
        threshold: `${side}.lagMs`,
        subject: box,
        value: health.lagMs,
        limit: lagMs,
        runbook: RUNBOOKS.outboxLag,
        describe: (value, limit) =>
          `${box} lag ${formatMs(value)} (oldest pending record), limit ${formatMs(limit)}`,
      });
    }
    verdict.judge({
      threshold: `${side}.failed`,
      subject: box,
      value: health.failed,
      limit: failed,
      runbook: RUNBOOKS.failedOutboxRows,
      describe: (value, limit) => `${box}: ${value} failed records, limit ${limit}`,
    });
  }
}

function boxHealth(stats: BoxStats, now = Date.now()): BoxHealth {
  const { pending, failed, oldestPendingAt } = stats;
  // Another instance's clock wrote createdAt: a little ahead of this one's, the lag is 0.
  return oldestPendingAt === null
    ? { pending, failed }
    : { pending, failed, lagMs: Math.max(0, now - oldestPendingAt) };
}
