/**
 * `nest-sequence/postgres`: the PostgreSQL outbox store, its migrations and `postgres()`, the
 * preset for the module's `stores` (peer: pg).
 *
 * @module nest-sequence/postgres
 */
export { PostgresOutboxStore } from './adapters/stores/postgres/postgres.outbox-store';
export type {
  PostgresOutboxConnectOptions,
  PostgresOutboxStoreOptions,
} from './adapters/stores/postgres/postgres-outbox.options';
export {
  migrateOutbox,
  type MigrateOutboxOptions,
} from './adapters/stores/postgres/postgres-migrations';
export {
  PostgresMigrationOutcomeUnknownError,
  PostgresOutboxError,
} from './adapters/stores/postgres/postgres-outbox.error';
export { postgres } from './adapters/presets/postgres.preset';
