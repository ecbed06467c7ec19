import { describeWithServer, SERVERS } from '../../support/servers';
import { OutboxPostgresAdmin } from './outbox-postgres.admin';
import { RabbitMqAdmin } from './rabbitmq.admin';

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
export interface OutboxServers {
  readonly admin: RabbitMqAdmin;
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
 * Registers the hooks the outbox fault tests share in the calling describe block: connects a
 * RabbitMqAdmin and a PostgreSQL admin before all tests, gives each test a fresh table prefix,
 * deletes the test's queues and tables after it, and closes everything after all tests. Call it
 * before the block's own hooks: jest runs hooks of one block in the order they were registered.
 */
export function useOutboxServers(options: OutboxServersOptions = {}): OutboxServers {
  let admin: RabbitMqAdmin | undefined;
  let postgres: OutboxPostgresAdmin | undefined;
  let tablePrefix: string | undefined;

  beforeAll(async () => {
    admin = await RabbitMqAdmin.connect();
    postgres = new OutboxPostgresAdmin(SERVERS.postgres.url);
  });

  beforeEach(() => {
    tablePrefix = postgres!.newTablePrefix();
  });

  afterEach(async () => {
    try {
      await options.beforeCleanup?.();
    } finally {
      await admin!.cleanup();
      await postgres!.cleanup();
    }
  });

  afterAll(async () => {
    await admin?.close();
    await postgres?.close();
  });

  const connected = <T>(value: T | undefined, what: string): T => {
    if (value === undefined) throw new Error(`useOutboxServers: no ${what} (yet)`);
    return value;
  };
  return {
    get admin() {
      return connected(admin, 'RabbitMqAdmin');
    },
    get postgres() {
      return connected(postgres, 'PostgreSQL admin');
    },
    get tablePrefix() {
      return connected(tablePrefix, 'table prefix outside a test');
    },
  };
}
