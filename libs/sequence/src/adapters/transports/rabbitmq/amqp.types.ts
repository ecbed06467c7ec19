import type { AmqpConnection } from '@golevelup/nestjs-rabbitmq';

/**
 * The pieces of golevelup's `AmqpConnection` this adapter uses, named through it so that
 * `amqp-connection-manager` (its dependency, not ours) is never imported directly.
 */
export type ConnectionManager = AmqpConnection['managedConnection'];
export type ManagedChannel = ReturnType<ConnectionManager['createChannel']>;
/** amqplib's connection (its `ChannelModel`), as the connection manager hands it out. */
export type BrokerConnection = NonNullable<ConnectionManager['connection']>;
