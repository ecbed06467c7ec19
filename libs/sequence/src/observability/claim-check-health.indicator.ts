import { resolveHealthCheck } from './health.options';
import { Inject, Injectable } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import { CLAIM_CHECK_STORES, type ClaimCheckStores } from '../kernel/tokens';
import {
  probe,
  type SequenceDependencyHealth,
  type SequenceHealthCheckOptions,
} from './sequence-health.indicator';

// Type aliases, not interfaces: terminus takes the details as a `Record<string, unknown>`.
export type ClaimCheckHealthDetails = {
  /** Every payload store tickets may name, by name (the write store first). */
  readonly stores: Readonly<Record<string, SequenceDependencyHealth>>;
  readonly ledger: SequenceDependencyHealth;
};

/**
 * `@nestjs/terminus` health indicator of Claim Check: pings every configured payload store and
 * the claim ledger at once, each within a timeout; up only when all answer.
 *
 * @example
 * ```ts
 * check() {
 *   return this.health.check([() => this.claimCheck.isHealthy('claim-check')]);
 * }
 * // { "claim-check": { "status": "up", "stores": { "s3": { "name": "s3", "status": "up" } },
 * //                    "ledger": { "name": "redis", "status": "up" } } }
 * ```
 */
@Injectable()
export class ClaimCheckHealthIndicator {
  constructor(
    private readonly health: HealthIndicatorService,
    @Inject(CLAIM_CHECK_STORES) private readonly options: ClaimCheckStores,
  ) {}

  async isHealthy<const Key extends string>(
    key: Key,
    options: SequenceHealthCheckOptions = {},
  ): Promise<HealthIndicatorResult<Key, 'up' | 'down', ClaimCheckHealthDetails>> {
    const { timeoutMs } = resolveHealthCheck('ClaimCheckHealthIndicator.isHealthy', options);
    const stores = [...this.options.stores.values()];
    const [ledger, ...storeHealth] = await Promise.all([
      probe(this.options.ledger, timeoutMs),
      ...stores.map((store) => probe(store, timeoutMs)),
    ]);
    const details: ClaimCheckHealthDetails = {
      stores: Object.fromEntries(storeHealth.map((health) => [health.name, health])),
      ledger,
    };
    const indicator = this.health.check(key);
    return [ledger, ...storeHealth].every((dependency) => dependency.status === 'up')
      ? indicator.up(details)
      : indicator.down(details);
  }
}
