import type { ClientConfig, PoolConfig } from 'pg';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import { checkDelay } from '../../../core/option-checks';
import { refuseUnknownKeys, type OptionKeysOf } from '../../../core/option-keys';
import { assertTablePrefix } from './postgres-outbox.sql';

/** Options of a {@link PostgresOutboxStore} over a pool, whoever created it. */
export interface PostgresOutboxStoreOptions {
  /**
   * Put before every table name (`<tablePrefix>outbox_events`, ...): a letter or underscore,
   * then up to 40 letters, digits or underscores.
   * @default ''
   */
  readonly tablePrefix?: string;
  /**
   * The LISTEN/NOTIFY channel that appends wake watchers on (a PostgreSQL identifier, at most
   * 63 characters). Stores that share tables must share it.
   * @default `${tablePrefix}nest_sequence_outbox`
   */
  readonly notifyChannel?: string;
  /**
   * Where the LISTEN connection of `watch()` connects (a URL or `pg` client settings). A URL
   * gets the pool defaults' `application_name`, timeouts and keep-alive; settings are used as
   * given.
   * @default the pool's own settings
   */
  readonly listenConnection?: string | ClientConfig;
  /**
   * Delay before reconnecting a dropped LISTEN connection; it doubles after each failed
   * attempt, up to `listenMaxBackoffMs`.
   * @default 100
   */
  readonly listenBackoffMs?: number;
  /** @default 10000 */
  readonly listenMaxBackoffMs?: number;
}

/** Options of {@link PostgresOutboxStore.connect}, whose pool the store creates and owns. */
export interface PostgresOutboxConnectOptions extends PostgresOutboxStoreOptions {
  /**
   * Settings of the pool (`max`, timeouts, `ssl`, ...), except the URL. Yours are merged over the
   * defaults. `query_timeout` (ms, measured by the client) bounds every statement, the relays'
   * claims included: without it a connection that stops answering (a failover, a half-open TCP
   * connection) stalls a relay until the operating system gives up on the socket, which takes
   * minutes to hours. `keepAlive` lets the system notice a dead idle connection.
   * @default { max: 10, application_name: 'nest-sequence', connectionTimeoutMillis: 30000,
   *   query_timeout: 60000, keepAlive: true, keepAliveInitialDelayMillis: 10000 }
   */
  readonly pool?: Omit<PoolConfig, 'connectionString'>;
}

export interface ResolvedPostgresOutboxOptions {
  readonly tablePrefix: string;
  readonly notifyChannel: string;
  readonly listenConnection: ClientConfig | undefined;
  readonly listenBackoffMs: number;
  readonly listenMaxBackoffMs: number;
}

export const POSTGRES_OUTBOX_DEFAULTS = {
  tablePrefix: '',
  channelSuffix: 'nest_sequence_outbox',
  listenBackoffMs: 100,
  listenMaxBackoffMs: 10_000,
  pool: {
    max: 10,
    application_name: 'nest-sequence',
    connectionTimeoutMillis: 30_000,
    query_timeout: 60_000,
    keepAlive: true,
    keepAliveInitialDelayMillis: 10_000,
  },
} as const;

/**
 * A LISTEN connection given as a URL: the pool's default name, timeouts and keep-alive, so that a
 * server that accepts the connection and never answers, or a half-open one, is given up on.
 */
const LISTEN_CONNECTION_DEFAULTS = (({ max: _max, ...connection }) => connection)(
  POSTGRES_OUTBOX_DEFAULTS.pool,
);

const CHANNEL = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;
/** The keys of the store's options (`pool`, `connect`'s, holds `pg`'s own: not checked here). */
const POSTGRES_STORE_KEYS = {
  tablePrefix: true,
  notifyChannel: true,
  listenConnection: true,
  listenBackoffMs: true,
  listenMaxBackoffMs: true,
  pool: true,
} as const satisfies OptionKeysOf<PostgresOutboxConnectOptions>;
const WHERE = 'PostgresOutboxStore options';

/** Defaults applied and every option checked; throws a {@link SequenceOptionsError}. */
export function resolvePostgresOutboxOptions(
  options: PostgresOutboxStoreOptions,
): ResolvedPostgresOutboxOptions {
  // A misspelt key (tablePrefx) would otherwise leave its option at the default: other tables.
  refuseUnknownKeys(WHERE, options, POSTGRES_STORE_KEYS);
  assertTablePrefix(options.tablePrefix ?? POSTGRES_OUTBOX_DEFAULTS.tablePrefix, WHERE);
  // Unquoted in SQL, the prefix is folded to lower case by PostgreSQL: 'App_' and 'app_' name
  // the same tables, so they must also give the same lock keys and notify channel.
  const tablePrefix = (options.tablePrefix ?? POSTGRES_OUTBOX_DEFAULTS.tablePrefix).toLowerCase();
  const notifyChannel =
    options.notifyChannel ?? `${tablePrefix}${POSTGRES_OUTBOX_DEFAULTS.channelSuffix}`;
  const listenBackoffMs = options.listenBackoffMs ?? POSTGRES_OUTBOX_DEFAULTS.listenBackoffMs;
  const listenMaxBackoffMs =
    options.listenMaxBackoffMs ?? POSTGRES_OUTBOX_DEFAULTS.listenMaxBackoffMs;

  const problems: string[] = [];
  if (!CHANNEL.test(notifyChannel)) {
    problems.push(
      `notifyChannel ${JSON.stringify(notifyChannel)} must match ${CHANNEL.source} ` +
        '(an unquoted PostgreSQL identifier of at most 63 characters)',
    );
  }
  // Whole ms a timer can wait: past 2^31 - 1 ms Node fires it after 1 ms, and a LISTEN
  // connection that keeps failing would be retried in a tight loop.
  const backoffOk = checkDelay(problems, 'listenBackoffMs', listenBackoffMs, 1);
  const maxOk = checkDelay(problems, 'listenMaxBackoffMs', listenMaxBackoffMs, 1);
  if (backoffOk && maxOk && listenMaxBackoffMs < listenBackoffMs) {
    problems.push('listenMaxBackoffMs must be at least listenBackoffMs');
  }
  if (problems.length > 0) throw new SequenceOptionsError(WHERE, problems);

  const { listenConnection } = options;
  return {
    tablePrefix,
    notifyChannel,
    listenConnection:
      typeof listenConnection === 'string'
        ? { ...LISTEN_CONNECTION_DEFAULTS, connectionString: listenConnection }
        : listenConnection,
    listenBackoffMs,
    listenMaxBackoffMs,
  };
}
