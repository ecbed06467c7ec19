/**
 * `nest-sequence/health`: the @nestjs/terminus integration, apart from the main entry so that
 * only applications that import it need @nestjs/terminus installed.
 *
 * @module nest-sequence/health
 */
export {
  SequenceHealthIndicator,
  type SequenceBufferHealth,
  type SequenceDependencyHealth,
  type SequenceHealthCheckOptions,
  type SequenceHealthDetails,
} from './observability/sequence-health.indicator';
export {
  ClaimCheckHealthIndicator,
  type ClaimCheckHealthDetails,
} from './observability/claim-check-health.indicator';
export {
  ResequencerHealthIndicator,
  type ResequencerHealthDetails,
} from './observability/resequencer-health.indicator';
export {
  OutboxHealthIndicator,
  type BoxHealth,
  type OutboxHealthDetails,
  type OutboxStoreHealth,
} from './observability/outbox-health.indicator';
export type { BoxHealthThresholds, SequenceHealthOptions } from './observability/health.options';
export type { HealthFinding, HealthFindings } from './observability/health-verdict';
export type { ResequencerGaps } from './resequencer/resequencer';
export { SequenceHealthModule } from './observability/sequence-health.module';
