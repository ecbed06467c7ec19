/**
 * The root entry point, `nest-sequence`: what an application writes. Adapters for real servers
 * live behind subpaths (`nest-sequence/rabbitmq`, `/nats`, `/redis`, `/postgres`, `/sqlite`,
 * `/s3`), so an application compiles with only the peers of the subpaths it imports; the wire
 * codecs are in `nest-sequence/wire`, the port contracts in full in `nest-sequence/ports`, the
 * conformance suites in `nest-sequence/testing` and the health indicators in
 * `nest-sequence/health`.
 *
 * @module nest-sequence
 */

// Module
export { SequenceModule } from './sequence.module';
export type { SequenceModuleOptions, RetryPolicy } from './options/module-options';
export { SEQUENCE_METRICS_REGISTRY, SEQUENCE_TRANSPORT } from './kernel/tokens';

// Decorators and what they take
export {
  SequencedHandler,
  type SequencedHandlerOptions,
} from './discovery/sequenced-handler.decorator';
export { ClaimCheck, type ClaimCheckHandlerOptions } from './discovery/claim-check.decorator';
export { Resequenced } from './discovery/resequenced.decorator';
export type { ResequencerDefinition } from './options/resequencer.options';
export { InboxHandler, type InboxHandlerOptions } from './discovery/inbox-handler.decorator';
export type { InboxContext } from './outbox/inbox-handler.options';
export type { HandlerContext } from './kernel/handler-call';

// Services
export { SplitterService } from './sequence/splitter.service';
export { AggregatorService } from './sequence/aggregator.service';
export { ClaimCheckService } from './claim-check/claim-check.service';
export { ResequencerService } from './resequencer/resequencer.service';
export { OutboxService } from './outbox/outbox.service';
export { SequenceEvents, type LifecycleEvent } from './observability/lifecycle-events';

// Payloads, events and what the services take and return
export type { RecordSource } from './core/payload-source';
export type { SendOptions, SequenceReceipt } from './sequence/splitter.types';
export { ReassembledPayload } from './sequence/reassembled-payload';
export { StreamedFragment } from './sequence/streamed-fragment';
export type {
  CheckInOptions,
  ClaimPublishOptions,
  ClaimPublishReceipt,
} from './claim-check/claim-check.service';
export { ClaimedPayload } from './claim-check/claimed-payload';
export type { Resequencer } from './resequencer/resequencer';
export { ResequencedEvent } from './resequencer/resequenced-event';
export type { GapEvent } from './core/gap-event';
export { OutboxEvent, OutboxCommand } from './core/outbox-message';
export { OutboxTransaction } from './outbox/outbox-transaction';
export type { ExpiredSequence } from './ports/sequence-store.port';

// Errors: one class per failure, each with a \`code\` and typed fields
export { SequenceError } from './core/errors/sequence.error';
export type { RejectionCode } from './core/errors/rejection-code';
export { MalformedFragmentError } from './core/errors/malformed-fragment.error';
export { SequenceIntegrityError } from './core/errors/sequence-integrity.error';
export { StoredFragmentIntegrityError } from './core/errors/stored-fragment-integrity.error';
export { SequencePublishError } from './core/errors/sequence-publish.error';
export { SequenceSourceError } from './core/errors/sequence-source.error';
export { PublishTimeoutError } from './core/errors/publish-timeout.error';
export { HandlerTimeoutError } from './core/errors/handler-timeout.error';
export { PublishRejectedError } from './core/errors/publish-rejected.error';
export { SubscribeError } from './core/errors/subscribe.error';
export { MessageTooLargeError } from './core/errors/message-too-large.error';
export { InvalidHeaderError } from './core/errors/invalid-header.error';
export { SequenceOptionsError } from './core/errors/sequence-options.error';
export { SequenceHandlerConflictError } from './core/errors/sequence-handler-conflict.error';
export { ClaimCheckNotFoundError } from './core/errors/claim-check-not-found.error';
export { InvalidPayloadRefError } from './core/errors/invalid-payload-ref.error';
export { ClaimTicketInvalidError } from './core/errors/claim-ticket-invalid.error';
export { ClaimCheckIntegrityError } from './core/errors/claim-check-integrity.error';
export { PayloadMetadataCorruptError } from './core/errors/payload-metadata-corrupt.error';
export { ClaimCheckPublishError } from './core/errors/claim-check-publish.error';
export { UnknownPayloadStoreError } from './core/errors/unknown-payload-store.error';
export { InvalidOutboxMessageError } from './core/errors/invalid-outbox-message.error';
export { OutboxForeignTransactionError } from './core/errors/outbox-foreign-transaction.error';
export { OutboxStoreBusyError } from './core/errors/outbox-store-busy.error';
export { OutboxStoreClosedError } from './core/errors/outbox-store-closed.error';
export { OutboxTransactionFinishedError } from './core/errors/outbox-transaction-finished.error';
export { PayloadDecryptionError } from './core/errors/payload-decryption.error';

// Ports (their full contracts, for adapter authors: `nest-sequence/ports`)
export type { Disposition, InboundMessage, Subscription, Transport } from './ports/transport.port';
export type { SequenceStore } from './ports/sequence-store.port';
export type { PayloadStore } from './ports/payload-store.port';
export type { ResequencerStore } from './ports/resequencer-store.port';
export type { OutboxStore } from './ports/outbox-store.port';

// Embedded adapters: the defaults, and what tests and single-process apps use
export { InMemoryTransport } from './adapters/transports/in-memory/in-memory.transport';
export {
  MemorySequenceStore,
  type MemorySequenceStoreOptions,
} from './adapters/stores/memory/memory.sequence-store';
export { MemoryResequencerStore } from './adapters/stores/memory/memory.resequencer-store';
export { MemoryClaimLedger } from './adapters/stores/memory/memory.claim-ledger';
export { FilesystemPayloadStore } from './adapters/payload/filesystem/filesystem.payload-store';
