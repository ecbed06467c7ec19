// Module
export { SequenceModule } from './sequence.module';
export type { SequenceModuleExtras } from './sequence.module-definition';
export {
  SEQUENCE_DEFAULTS,
  type SequenceModuleOptions,
  type SequenceConsumerOptions,
  type PublishRetryOptions,
  type HandlerRetryOptions,
  type ResolvedSequenceOptions,
} from './sequence.options';
export { SEQUENCE_OPTIONS, SEQUENCE_STORE, SEQUENCE_TRANSPORT } from './sequence.constants';

// Message Sequence
export { SplitterService } from './sequence/splitter.service';
export type {
  SplitterPayload,
  RecordSource,
  SendOptions,
  SequenceReceipt,
} from './sequence/splitter.types';
export {
  AggregatorService,
  type SequenceConsumer,
  type SequenceHandlerFn,
} from './sequence/aggregator.service';
export { ReassembledPayload } from './sequence/reassembled-payload';
export { ExpirySweeper } from './sequence/expiry.sweeper';
export {
  SequencedHandler,
  type SequencedHandlerOptions,
} from './discovery/sequenced-handler.decorator';
export {
  SequencedHandlerRegistry,
  type RegisteredSequenceHandler,
} from './discovery/sequenced-handler.registry';

// Claim Check
export { ClaimCheckService } from './claim-check/claim-check.service';
export type {
  CheckInOptions,
  ClaimPublishOptions,
  ClaimPublishReceipt,
} from './claim-check/claim-check.service';
export { ClaimedPayload, type ClaimDelivery } from './claim-check/claimed-payload';
export {
  CLAIM_CHECK_DEFAULTS,
  type ClaimCheckOptions,
  type ClaimRetention,
  type ResolvedClaimCheckOptions,
} from './claim-check/claim-check.options';
export { CLAIM_CHECK_OPTIONS } from './claim-check/claim-check.constants';
export { ClaimCheckHeader } from './claim-check/claim-check.headers';
export type {
  ClaimCheckConsumerOptions,
  ClaimCheckHandlerFn,
} from './claim-check/claim-check-consumer';
export { ClaimCheckReceiver } from './claim-check/claim-check.receiver';
export { OrphanSweeper, type OrphanSweepReport } from './claim-check/orphan.sweeper';
export { ClaimCheck, type ClaimCheckHandlerOptions } from './discovery/claim-check.decorator';
export {
  ClaimCheckRegistry,
  type RegisteredClaimCheckHandler,
} from './discovery/claim-check.registry';
export {
  signTicket,
  verifyTicket,
  parseTicketBody,
  serializeTicket,
  type ClaimTicket,
  type ClaimTicketFields,
} from './core/claim-ticket';
export { ClaimTicketKeyring, type ClaimTicketKey } from './core/claim-ticket-keyring';

export { StreamedFragment } from './sequence/streamed-fragment';
export type { FragmentHandlerFn } from './sequence/fragment-stream';

// Resequencer
export { ResequencerService } from './resequencer/resequencer.service';
export {
  Resequencer,
  type DrainResult,
  type ResequencerSweepReport,
} from './resequencer/resequencer';
export { Resequenced } from './discovery/resequenced.decorator';
export { ResequencerRegistry, type RegisteredResequencer } from './discovery/resequencer.registry';
export {
  ResequencedEvent,
  ResequenceHeader,
  type ResequencerInput,
} from './resequencer/resequenced-event';
export type { GapEvent } from './resequencer/gap-event';
export type { GapListener } from './resequencer/gap.reporter';
export { GapSweeper, type GapSweepReport } from './resequencer/gap.sweeper';
export {
  RESEQUENCER_DEFAULTS,
  type OverflowPolicy,
  type ResequencerDefinition,
  type ResequencerField,
  type ResequencerModuleOptions,
  type ResolvedResequencer,
} from './resequencer/resequencer.options';
export { RESEQUENCER_STORE } from './resequencer/resequencer.constants';

// Outbox / Inbox
export { OutboxService, type JoinOptions } from './outbox/outbox.service';
export { OutboxTransaction, type MessageHeaders } from './outbox/outbox-transaction';
export {
  OutboxEvent,
  OutboxCommand,
  type EventInput,
  type CommandInput,
} from './outbox/outbox-message';
export { attachOutboxMessageRules } from './outbox/outbox-message.rules';
export {
  MESSAGE_ID_HEADER,
  MESSAGE_KIND_HEADER,
  MESSAGE_TYPE_HEADER,
  parseMessage,
} from './outbox/outbox-message.codec';
export {
  OUTBOX_DEFAULTS,
  type BoxOptions,
  type OutboxModuleOptions,
} from './outbox/outbox.options';
export { OutboxRuntime } from './outbox/outbox.runtime';
export { InboxHandler } from './discovery/inbox-handler.decorator';
export {
  InboxHandlerRegistry,
  type RegisteredInboxHandler,
} from './discovery/inbox-handler.registry';
export type {
  InboxContext,
  InboxHandlerOptions,
  InboxHandlerFunction,
} from './outbox/inbox-handler.options';
export * from './ports/outbox-store.port';
export {
  SqliteOutboxStore,
  type SqliteOutboxOpenOptions,
  type SqliteOutboxStoreOptions,
} from './adapters/stores/sqlite/sqlite.outbox-store';
export { PostgresOutboxStore } from './adapters/stores/postgres/postgres.outbox-store';
export type {
  PostgresOutboxStoreOptions,
  PostgresOutboxConnectOptions,
} from './adapters/stores/postgres/postgres-outbox.options';
export {
  migrateOutbox,
  type MigrateOutboxOptions,
} from './adapters/stores/postgres/postgres-migrations';

// Wire contract and errors
export {
  SequenceHeader,
  WIRE_VERSION,
  SEQUENCE_ID_PATTERN,
  parseFragmentHeaders,
  buildFragmentHeaders,
  type FragmentHeaders,
  type HeaderMap,
  type HeaderValue,
} from './core/headers';
export * from './core/errors';

// Ports and embedded adapters
export * from './ports/transport.port';
export * from './ports/sequence-store.port';
export { InMemoryTransport } from './adapters/transports/in-memory/in-memory.transport';
export { RabbitMqTransport } from './adapters/transports/rabbitmq/rabbitmq.transport';
export type { RabbitMqTransportOptions } from './adapters/transports/rabbitmq/rabbitmq.options';
export { RabbitMqTopologyError } from './adapters/transports/rabbitmq/errors/rabbitmq-topology.error';
export { MemorySequenceStore } from './adapters/stores/memory/memory.sequence-store';
export {
  RedisSequenceStore,
  type RedisSequenceStoreOptions,
} from './adapters/stores/redis/redis.sequence-store';
export { RedisSequenceStoreError } from './adapters/stores/redis/redis-store.error';
export * from './ports/payload-store.port';
export * from './ports/claim-ledger.port';
export {
  assertResequencerArguments,
  isResequencerKey,
  isSequenceNumber,
  MAX_SEQUENCE_NUMBER,
  type AcceptContext as ResequencerAcceptContext,
  type AcceptOutcome as ResequencerAcceptOutcome,
  type DrainClaim,
  type DrainContext,
  type DrainSettlement,
  type GapPolicy,
  type GapResolution,
  type HandOffItem,
  type OpenGap,
  type ResequencedEntry,
  type ResequencerKey,
  type ResequencerKeyState,
  type ResequencerLimits,
  type ResequencerStore,
} from './ports/resequencer-store.port';
export {
  MemoryResequencerStore,
  type MemoryResequencerStoreOptions,
} from './adapters/stores/memory/memory.resequencer-store';
export { FilesystemPayloadStore } from './adapters/payload/filesystem/filesystem.payload-store';
export type { FilesystemPayloadStoreOptions } from './adapters/payload/filesystem/filesystem.payload-store.options';
export { RedisPayloadStore } from './adapters/payload/redis/redis.payload-store';
export type { RedisPayloadStoreOptions } from './adapters/payload/redis/redis-payload.options';
export { RedisPayloadStoreError } from './adapters/payload/redis/redis-payload-store.error';
export { S3PayloadStore } from './adapters/payload/s3/s3.payload-store';
export type {
  S3PayloadStoreOptions,
  S3ConnectOptions,
} from './adapters/payload/s3/s3.payload-store.options';
export { S3PayloadTooLargeError } from './adapters/payload/s3/s3-payload-too-large.error';
export {
  EncryptingPayloadStore,
  type EncryptingPayloadStoreOptions,
} from './adapters/payload/encrypting/encrypting.payload-store';
export type { PayloadEncryptionKey } from './adapters/payload/encrypting/payload-encryption.keys';
export { PayloadDecryptionError } from './adapters/payload/encrypting/payload-decryption.error';
export {
  MemoryClaimLedger,
  type MemoryClaimLedgerOptions,
} from './adapters/stores/memory/memory.claim-ledger';
export {
  RedisClaimLedger,
  type RedisClaimLedgerOptions,
} from './adapters/stores/redis/redis.claim-ledger';
export { RedisClaimLedgerError } from './adapters/stores/redis/redis-claim-ledger.error';
export {
  RedisResequencerStore,
  type RedisResequencerStoreOptions,
} from './adapters/stores/redis/redis.resequencer-store';
export { RedisResequencerStoreError } from './adapters/stores/redis/redis-resequencer-store.error';

// Observability
export { SequenceMetrics } from './observability/sequence.metrics';
export { ClaimCheckMetrics } from './observability/claim-check.metrics';
export { ResequencerMetrics, type ResequencerIntake } from './observability/resequencer.metrics';
export { OutboxMetrics, type InboxIntake } from './observability/outbox.metrics';
