import { Inject, Injectable } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import type { ResequencerStore } from '../ports/resequencer-store.port';
import { RESEQUENCER_STORE } from '../kernel/tokens';
import type { ResequencerBuffers } from '../resequencer/resequencer';
import { ResequencerService } from '../resequencer/resequencer.service';
import { withTimeout } from '../core/async';
import {
  probe,
  type SequenceDependencyHealth,
  type SequenceHealthCheckOptions,
} from './sequence-health.indicator';

// A type alias, not an interface: terminus takes the details as a `Record<string, unknown>`.
export type ResequencerHealthDetails = {
  readonly store: SequenceDependencyHealth;
  /**
   * Per resequencer, what its buffers hold against `maxBufferedTotal` and
   * `maxBufferedBytesTotal`; absent while the store is down.
   */
  readonly buffers?: Readonly<Record<string, ResequencerBuffers>>;
};

const DEFAULT_TIMEOUT_MS = 1_000;

/**
 * `@nestjs/terminus` health indicator of the Resequencer: pings its store (Redis, or the embedded
 * memory store) within a timeout, and reports what each resequencer buffers against its bounds
 * (full buffers are back-pressure, not a failure: they do not make it down). While the store is
 * down, input events are requeued, never acked.
 *
 * @example
 * ```ts
 * check() {
 *   return this.health.check([() => this.resequencer.isHealthy('resequencer')]);
 * }
 * // { "resequencer": { "status": "up", "store": { "name": "redis", "status": "up" },
 * //   "buffers": { "orders": { "events": 12, "maxEvents": 100000, "bytes": 20480,
 * //                            "maxBytes": 268435456 } } } }
 * ```
 */
@Injectable()
export class ResequencerHealthIndicator {
  constructor(
    private readonly health: HealthIndicatorService,
    @Inject(RESEQUENCER_STORE) private readonly store: ResequencerStore,
    private readonly resequencers: ResequencerService,
  ) {}

  async isHealthy<const Key extends string>(
    key: Key,
    options: SequenceHealthCheckOptions = {},
  ): Promise<HealthIndicatorResult<Key, 'up' | 'down', ResequencerHealthDetails>> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const store = await probe(this.store, timeoutMs);
    const indicator = this.health.check(key);
    if (store.status === 'down') return indicator.down({ store });
    const buffers = await withTimeout(
      this.resequencers.buffers(),
      timeoutMs,
      () => new Error('the buffered totals took too long'),
    ).catch(() => undefined);
    return indicator.up(buffers ? { store, buffers } : { store });
  }
}
