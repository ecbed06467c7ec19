/**
 * `nest-sequence/nats`: the NATS JetStream transport (peers: @nats-io/transport-node,
 * @nats-io/jetstream).
 *
 * @module nest-sequence/nats
 */
export { NatsTransport } from './adapters/transports/nats/nats.transport';
export type { NatsTransportOptions } from './adapters/transports/nats/nats.options';
export type { NatsConnection, NatsConnectionOptions } from './adapters/transports/nats/nats.client';
export { NatsTopologyError } from './adapters/transports/nats/errors/nats-topology.error';
export { NatsDuplicateWindowError } from './adapters/transports/nats/errors/nats-duplicate-window.error';
export { BrokerUnavailableError } from './core/errors/broker-unavailable.error';
