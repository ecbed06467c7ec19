import { describeWithServer } from '../../support/servers';
import { usePostgres, type OutboxPostgresAdmin } from '../../support/postgres.fixture';
import type { BrokerAdmin } from '../../support/broker-admin';
import { useRabbitMq, type RabbitMqAdmin } from '../../support/rabbitmq.fixture';
import { useTransportAdmin, type TransportCase } from '../../support/transports.fixture';

/**
 * `describe` for the outbox fault tests, which need RabbitMQ and PostgreSQL: skipped with a
 * warning when either is down, and failing (naming the server) under CI.
 */
export function describeOnOutboxServers(name: string, body: () => void): void {
  describeWithServer('rabbitmq', name, () => {
    describeWithServer('postgres', 'on RabbitMQ and PostgreSQL', body);
  });
}

/** What `useOutboxServers` connected, and the current test's table prefix. */
export interface OutboxServers<A extends BrokerAdmin = RabbitMqAdmin> {
  readonly admin: A;
  readonly postgres: OutboxPostgresAdmin;
  /** Fresh for each test; its tables are dropped after it. */
  readonly tablePrefix: string;
}

export interface OutboxServersOptions {
  /**
   * Runs after each test, before its queues and tables are deleted: close the apps, kill the
   * processes that use them.
   */
  readonly beforeCleanup?: () => Promise<void>;
}

/**
 * Registers the hooks the outbox fault tests share in the calling describe block
 * ({@link useRabbitMq} and {@link usePostgres}): connects a
 * RabbitMqAdmin and a PostgreSQL admin before all tests, gives each test a fresh table prefix,
 * deletes the test's queues and tables after it, and closes everything after all tests. Call it
 * before the block's own hooks: jest runs hooks of one block in the order they were registered.
 */
export function useOutboxServers(options: OutboxServersOptions = {}): OutboxServers {
  return outboxServers(useRabbitMq(options));
}

/** {@link useOutboxServers} on the broker of `transport`, through its {@link BrokerAdmin}. */
export function useOutboxServersOn(
  transport: TransportCase,
  options: OutboxServersOptions = {},
): OutboxServers<BrokerAdmin> {
  return outboxServers(useTransportAdmin(transport, options));
}

function outboxServers<A extends BrokerAdmin>(broker: { readonly admin: A }): OutboxServers<A> {
  const postgres = usePostgres();
  return {
    get admin() {
      return broker.admin;
    },
    get postgres() {
      return postgres.admin;
    },
    get tablePrefix() {
      return postgres.tablePrefix;
    },
  };
}
