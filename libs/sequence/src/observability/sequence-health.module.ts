import { Module } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { ClaimCheckHealthIndicator } from './claim-check-health.indicator';
import { OutboxHealthIndicator } from './outbox-health.indicator';
import { ResequencerHealthIndicator } from './resequencer-health.indicator';
import { SequenceHealthIndicator } from './sequence-health.indicator';

/**
 * Provides {@link SequenceHealthIndicator}, {@link ClaimCheckHealthIndicator},
 * {@link ResequencerHealthIndicator} and {@link OutboxHealthIndicator}, and re-exports `TerminusModule` (its
 * `HealthCheckService`). The indicator injects the transport and store of a `SequenceModule`
 * registered with `isGlobal: true`; otherwise add it to the providers of the module that imports
 * `SequenceModule` and `TerminusModule`.
 */
@Module({
  imports: [TerminusModule],
  providers: [
    SequenceHealthIndicator,
    ClaimCheckHealthIndicator,
    ResequencerHealthIndicator,
    OutboxHealthIndicator,
  ],
  exports: [
    SequenceHealthIndicator,
    ClaimCheckHealthIndicator,
    ResequencerHealthIndicator,
    OutboxHealthIndicator,
    TerminusModule,
  ],
})
export class SequenceHealthModule {}
