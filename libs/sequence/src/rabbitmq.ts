/**
 * `nest-sequence/rabbitmq`: the RabbitMQ transport (peers: @golevelup/nestjs-rabbitmq, amqplib).
 *
 * @module nest-sequence/rabbitmq
 */
export { RabbitMqTransport } from './adapters/transports/rabbitmq/rabbitmq.transport';
export type {
  RabbitMqQueueType,
  RabbitMqTransportOptions,
} from './adapters/transports/rabbitmq/rabbitmq.options';
export { RabbitMqTopologyError } from './adapters/transports/rabbitmq/errors/rabbitmq-topology.error';
export { BrokerUnavailableError } from './core/errors/broker-unavailable.error';
