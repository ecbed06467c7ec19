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

// Observability
export { SequenceMetrics } from './observability/sequence.metrics';
