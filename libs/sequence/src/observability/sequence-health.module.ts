import { Module, type DynamicModule } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { ClaimCheckHealthIndicator } from './claim-check-health.indicator';
import { HEALTH_OPTIONS, resolveHealthOptions, type SequenceHealthOptions } from './health.options';
import { OutboxHealthIndicator } from './outbox-health.indicator';
import { ResequencerHealthIndicator } from './resequencer-health.indicator';
import { SequenceHealthIndicator } from './sequence-health.indicator';

const indicators = [
  SequenceHealthIndicator,
  ClaimCheckHealthIndicator,
  ResequencerHealthIndicator,
  OutboxHealthIndicator,
];

/**
 * Provides {@link SequenceHealthIndicator}, {@link ClaimCheckHealthIndicator},
 * {@link ResequencerHealthIndicator} and {@link OutboxHealthIndicator}, and re-exports `TerminusModule` (its
 * `HealthCheckService`). The indicator injects the transport and store of a `SequenceModule`
 * registered with `isGlobal: true`; otherwise add it to the providers of the module that imports
 * `SequenceModule` and `TerminusModule`.
 *
 * Imported as it is, the indicators judge the default thresholds; `forRoot` sets others.
 */
@Module({
  imports: [TerminusModule],
  providers: indicators,
  exports: [...indicators, TerminusModule],
})
export class SequenceHealthModule {
  /**
   * The indicators, judging `options`' thresholds (the rest at their defaults).
   * @throws SequenceOptionsError listing every bad threshold, when the module is built
   * @example
   * SequenceHealthModule.forRoot({ sequence: { bufferPercent: 90 }, outbox: { lagMs: 60_000 } })
   */
  static forRoot(options: SequenceHealthOptions = {}): DynamicModule {
    const resolved = resolveHealthOptions(options);
    return {
      module: SequenceHealthModule,
      providers: [{ provide: HEALTH_OPTIONS, useValue: resolved }, ...indicators],
      exports: [...indicators, TerminusModule],
    };
  }
}
