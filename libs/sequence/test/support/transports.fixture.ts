/**
 * The brokers a transport-neutral suite runs on: one {@link TransportCase} per real broker, and
 * {@link describeOnTransports}, which runs a suite once on each. A suite written against a case
 * (its transports, its {@link BrokerAdmin}, the environment of its fixture processes) is
 * parameterised by transport, not copied.
 */
import type { Transport } from 'nest-sequence';
import { useBrokerAdmin, type BrokerAdmin, type BrokerAdminOptions } from './broker-admin';
import { NATS_URL, NatsAdmin, namedNatsTransport } from './nats.fixture';
import { AMQP_URL, namedTransport, RabbitMqAdmin } from './rabbitmq.fixture';
import { describeWithServer, type ServerName } from './servers';

export interface TransportCase {
  /** What the suite's name says it runs on. */
  readonly name: string;
  readonly server: 'rabbitmq' | 'nats';
  /**
   * A transport of its own whose connection the broker lists under `name`, reconnecting after
   * `reconnectMs` (default 200), with the transport's `unsafeSocketTricks` when asked. The caller
   * closes it.
   */
  connect(
    name: string,
    options?: { reconnectMs?: number; unsafeSocketTricks?: boolean },
  ): Promise<Transport>;
  connectAdmin(): Promise<BrokerAdmin>;
  /** What a fixture process reads to connect the same way (see fixtures/fixture-transport.ts). */
  readonly processEnv: Readonly<Record<string, string>>;
}

const RABBITMQ_CASE: TransportCase = {
  name: 'RabbitMQ',
  server: 'rabbitmq',
  connect: (name, options = {}) =>
    namedTransport(name, {
      reconnectSeconds: (options.reconnectMs ?? 200) / 1_000,
      transport: { unsafeSocketTricks: options.unsafeSocketTricks },
    }),
  connectAdmin: () => RabbitMqAdmin.connect(),
  processEnv: { TRANSPORT: 'rabbitmq', AMQP_URL },
};

const NATS_CASE: TransportCase = {
  name: 'NATS JetStream',
  server: 'nats',
  connect: (name, options = {}) =>
    namedNatsTransport(name, {
      reconnectMs: options.reconnectMs,
      transport: { unsafeSocketTricks: options.unsafeSocketTricks },
    }),
  connectAdmin: () => NatsAdmin.connect(),
  processEnv: { TRANSPORT: 'nats', NATS_URL },
};

/**
 * Every broker, or those `TEST_TRANSPORTS` names (comma-separated `rabbitmq`, `nats`), to run a
 * suite on one broker only.
 */
export const TRANSPORT_CASES: readonly TransportCase[] = [RABBITMQ_CASE, NATS_CASE].filter(
  (transport) =>
    !process.env.TEST_TRANSPORTS ||
    process.env.TEST_TRANSPORTS.split(',').includes(transport.server),
);

/**
 * Runs `body` once per broker of {@link TRANSPORT_CASES}, in a block named `<name> on <broker>`
 * that needs that broker and the servers of `needs` (see describeWithServer: skipped with a
 * warning when one is down, failing under CI).
 */
export function describeOnTransports(
  name: string,
  needs: readonly ServerName[],
  body: (transport: TransportCase) => void,
): void {
  for (const transport of TRANSPORT_CASES) {
    const withServers = needs.reduceRight<() => void>(
      (inner, server) => () => describeWithServer(server, `with ${server}`, inner),
      () => body(transport),
    );
    describeWithServer(transport.server, `${name} on ${transport.name}`, withServers);
  }
}

/** {@link useBrokerAdmin} for the case's broker. */
export function useTransportAdmin(
  transport: TransportCase,
  options: BrokerAdminOptions = {},
): { readonly admin: BrokerAdmin } {
  return useBrokerAdmin(() => transport.connectAdmin(), options);
}
