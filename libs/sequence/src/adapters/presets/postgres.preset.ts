import type { Pool } from 'pg';
import type { StoreSet } from '../../ports/store-set.port';
import type { PostgresOutboxConnectOptions } from '../stores/postgres/postgres-outbox.options';
import { PostgresOutboxStore } from '../stores/postgres/postgres.outbox-store';

/**
 * The PostgreSQL stores of the module, for `SequenceModule.forRoot({ stores })`: the outbox store
 * (the outbox and inbox tables, and the business writes of `OutboxService.transaction`). Given a
 * URL, the preset opens the pool and the module closes it at shutdown; given a pool, it is yours
 * to end after the application.
 *
 * @example
 * SequenceModule.forRoot({
 *   transport,
 *   stores: [redis(process.env.REDIS_URL), postgres(process.env.DATABASE_URL, { tablePrefix: 'orders_' })],
 *   outbox: { serviceName: 'orders' },
 * })
 */
export function postgres(
  urlOrPool: string | Pool,
  options: PostgresOutboxConnectOptions = {},
): StoreSet {
  const outboxStore =
    typeof urlOrPool === 'string'
      ? PostgresOutboxStore.connect(urlOrPool, options)
      : new PostgresOutboxStore(urlOrPool, options);
  return {
    name: 'postgres',
    outboxStore,
    close: () => outboxStore.close(),
  };
}
