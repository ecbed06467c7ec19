import { Inject, Injectable } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import type { ResequencerStore } from '../ports/resequencer-store.port';
import { RESEQUENCER_STORE } from '../kernel/tokens';
import {
  probe,
  type SequenceDependencyHealth,
  type SequenceHealthCheckOptions,
} from './sequence-health.indicator';

// A type alias, not an interface: terminus takes the details as a `Record<string, unknown>`.
export type ResequencerHealthDetails = {
  readonly store: SequenceDependencyHealth;
};

const DEFAULT_TIMEOUT_MS = 1_000;

/**
 * `@nestjs/terminus` health indicator of the Resequencer: pings its store (Redis, or the embedded
 * memory store) within a timeout. While it is down, input events are requeued, never acked.
 *
 * @example
 * ```ts
 * check() {
 *   return this.health.check([() => this.resequencer.isHealthy('resequencer')]);
 * }
 * // { "resequencer": { "status": "up", "store": { "name": "redis", "status": "up" } } }
 * ```
 */
@Injectable()
export class ResequencerHealthIndicator {
  constructor(
    private readonly health: HealthIndicatorService,
    @Inject(RESEQUENCER_STORE) private readonly store: ResequencerStore,
  ) {}

  async isHealthy<const Key extends string>(
    key: Key,
    options: SequenceHealthCheckOptions = {},
  ): Promise<HealthIndicatorResult<Key, 'up' | 'down', ResequencerHealthDetails>> {
    const store = await probe(this.store, options.timeoutMs ?? DEFAULT_TIMEOUT_MS);
    const indicator = this.health.check(key);
    return store.status === 'up' ? indicator.up({ store }) : indicator.down({ store });
  }
}
