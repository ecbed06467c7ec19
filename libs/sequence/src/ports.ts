/**
 * `nest-sequence/ports`: the port contracts in full (every type their methods take and return),
 * for authors of adapters: a transport, a sequence, resequencer or outbox store, a payload store or
 * a claim ledger of their own. Prove one with the suites of `nest-sequence/testing`.
 *
 * @module nest-sequence/ports
 */
export type {
  Disposition,
  InboundMessage,
  MessageHandler,
  PartitionAddress,
  PublishOptions,
  ReplyChannelOptions,
  SubscribeOptions,
  Subscription,
  Transport,
} from './ports/transport.port';
export type { FinalRefusal } from './ports/transport.port';
export {
  defaultDeadLetterChannel,
  isFinalRefusal,
  MAX_PREFETCH,
  REQUEUE_COUNT_HEADER,
  requeueCount,
} from './ports/transport.port';
export { partitionIndex } from './core/partition';
export { PartitionCountMismatchError } from './core/errors/partition-count-mismatch.error';
export {
  BrokerUnavailableError,
  type BrokerUnavailableReason,
} from './core/errors/broker-unavailable.error';
// What a store or a claim ledger that stops answering leads to (see docs/claim-check.md,
// docs/resequencer.md and docs/message-sequence.md).
export {
  PayloadReadTimeoutError,
  type PayloadReadStep,
} from './core/errors/payload-read-timeout.error';
export {
  PayloadStoreTimeoutError,
  type PayloadStoreCall,
} from './core/errors/payload-store-timeout.error';
export {
  ClaimLedgerTimeoutError,
  type ClaimLedgerCall,
} from './core/errors/claim-ledger-timeout.error';
export { ClaimLeaseLostError } from './core/errors/claim-lease-lost.error';
export { SequenceLeaseLostError } from './core/errors/sequence-lease-lost.error';
export { ResequencerStoreTimeoutError } from './core/errors/resequencer-store-timeout.error';
export { SequenceStoreTimeoutError } from './core/errors/sequence-store-timeout.error';
export type {
  DeadLetter,
  DeadLetterActionResult,
  DeadLetterBox,
  DeadLetterLocation,
  DeadLetterPage,
} from './ports/dead-letter-box.port';
export {
  MAX_DEAD_LETTER_BROWSE,
  REPLAY_COUNT_HEADER,
  REPLAYED_AT_HEADER,
} from './ports/dead-letter-box.port';
export type {
  AcceptContext,
  AcceptResult,
  CompleteSequence,
  ExpiredSequence,
  ExpiryPolicy,
  FinishContext,
  FinishedOutcome,
  FragmentRecord,
  SequenceLimits,
  SequenceStatus,
  SequenceRef,
  SequenceStore,
  SequenceStoreStats,
} from './ports/sequence-store.port';
export type {
  PayloadInfo,
  PayloadMetadata,
  PayloadStore,
  GetOptions,
  PutOptions,
  StoredPayload,
  SweepCandidate,
  SweepQuery,
  SweepReason,
} from './ports/payload-store.port';
export { deleteIfUnpublished } from './ports/payload-store.port';
export type {
  ClaimKey,
  ClaimLedger,
  ClaimOutcome,
  ClaimTimes,
  Completion,
} from './ports/claim-ledger.port';
export { assertClaimArguments } from './ports/claim-ledger.port';
export type {
  AcceptContext as ResequencerAcceptContext,
  AcceptOutcome as ResequencerAcceptOutcome,
  DrainClaim,
  DrainContext,
  DrainSettlement,
  ExpiringGap,
  GapPolicy,
  GapResolution,
  GapResolveContext,
  HandOffItem,
  OpenGap,
  ResequencedEntry,
  ResequencerKey,
  ResequencerKeyState,
  ResequencerLimits,
  ResequencerStore,
} from './ports/resequencer-store.port';
export {
  assertResequencerArguments,
  CLOSED_KEY_NEXT,
  isResequencerKey,
  isSequenceNumber,
  MAX_SEQUENCE_NUMBER,
} from './ports/resequencer-store.port';
export type {
  BoxName,
  BoxStats,
  ClaimedBatch,
  ClaimOptions,
  ClaimResult,
  MessageKind,
  NewBoxRecord,
  OutboxDialect,
  OutboxStore,
  PurgeOptions,
  RecordOutcome,
  RecordStatus,
  SqlExecutor,
  StoredRecord,
  StoreTransaction,
} from './ports/outbox-store.port';
export { BOX_NAMES } from './ports/outbox-store.port';
export { NestedTransactionOpenError } from './core/errors/nested-transaction-open.error';
export { SavepointEndedError } from './core/errors/savepoint-ended.error';
export { InboxCallEndedError } from './core/errors/inbox-call-ended.error';
export { ShutdownTimeoutError } from './core/errors/shutdown-timeout.error';
export { InboxSessionEndedError } from './core/errors/inbox-session-ended.error';
export { ClaimCommitRefusedError } from './core/errors/claim-commit-refused.error';
export type { StoreSet } from './ports/store-set.port';
export type { FragmentHeaders, HeaderMap, HeaderValue } from './core/headers';
export type { StoreEncryptionOptions } from './core/body-cipher';
export { StoredFragmentDecryptionError } from './core/errors/stored-fragment-decryption.error';
