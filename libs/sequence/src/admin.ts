/**
 * `nest-sequence/admin`: the operator console's API, opt-in and apart from the main entry.
 *
 * @module nest-sequence/admin
 */
export {
  SequenceAdminModule,
  type SequenceAdminAsyncOptions,
  type SequenceAdminFactoryOptions,
} from './admin/sequence-admin.module';
export type { SequenceAdminOptions } from './admin/admin.options';
export type { MutationAnswer } from './admin/admin-actions';
export type { Overview, Problem } from './admin/overview.reader';
export type { PositionRange, SequenceItem, SequenceView } from './admin/sequences.reader';
export type { DeadLetterAnswer, DeadLetterChannelSummary } from './admin/dead-letters.reader';
export type { GapAnswer, GapItem } from './admin/resequencer.reader';
export type { FailedRowItem } from './admin/boxes.reader';
export type { ClaimStatus } from './admin/claims.reader';
export type { FindMatch } from './admin/find.reader';
export type { AdminErrorCode } from './admin/admin.errors';
