/**
 * `nest-sequence/testing`: the behavioural suite of each port, which every adapter of this
 * package passes, for adapters written elsewhere to prove themselves against the same contract;
 * and doubles for tests. The suites run under a test runner with Jest-style globals (`describe`,
 * `it`, `expect`, `beforeEach`...: Jest, or Vitest with `globals: true`).
 *
 * @example
 * describeSequenceStoreConformance('my store', {
 *   create: async () => new MySequenceStore(connection, { prefix: randomUUID() }),
 * });
 *
 * @module nest-sequence/testing
 */
export {
  describeTransportConformance,
  type TransportHarness,
} from './testing/conformance/transport.conformance';
export {
  describeReplyChannelConformance,
  type ReplyChannelHarness,
} from './testing/conformance/reply-channel.conformance';
export {
  describePartitionedChannelConformance,
  type PartitionedChannelHarness,
} from './testing/conformance/partitioned-channel.conformance';
export {
  describeSequenceStoreConformance,
  storedChargeOf,
  type SequenceStoreHarness,
} from './testing/conformance/sequence-store.conformance';
export {
  describePayloadStoreConformance,
  type PayloadStoreHarness,
} from './testing/conformance/payload-store.conformance';
export {
  describeClaimLedgerConformance,
  type ClaimLedgerHarness,
} from './testing/conformance/claim-ledger.conformance';
export {
  describeResequencerStoreConformance,
  type ResequencerStoreHarness,
} from './testing/conformance/resequencer-store.conformance';
export {
  describeOutboxStoreConformance,
  type OutboxStoreHarness,
} from './testing/conformance/outbox-store.conformance';
export {
  describeDeadLetterBoxConformance,
  type DeadLetterBoxHarness,
} from './testing/conformance/dead-letter-box.conformance';
export { ForwardingTransport } from './testing/forwarding.transport';
