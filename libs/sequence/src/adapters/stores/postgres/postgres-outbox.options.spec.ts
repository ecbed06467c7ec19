import { Pool } from 'pg';
import { SequenceOptionsError } from '../../../core/errors/sequence-options.error';
import {
  resolvePostgresOutboxOptions,
  type PostgresOutboxStoreOptions,
} from './postgres-outbox.options';
import { PostgresOutboxStore } from './postgres.outbox-store';

const untyped = <T>(value: unknown): T => value as T;

/** The store's own options are checked when it is made, before anything connects. */
describe('PostgresOutboxStore options', () => {
  let pool: Pool;
  beforeEach(() => {
    // Never connected: the constructor only checks the options.
    pool = new Pool({ connectionString: 'postgres://postgres@127.0.0.1:5432/test' });
  });
  afterEach(async () => {
    await pool.end();
  });

  it('refuses a listen backoff past the longest a timer waits (the reconnect would spin every 1 ms)', () => {
    // Node fires a setTimeout of more than 2^31-1 ms after 1 ms: the first reconnect delay is
    // drawn from [2^31, 2^32), so a LISTEN connection that keeps failing is retried in a tight
    // loop. checkDelay refuses such values everywhere else in the library.
    expect(
      () =>
        new PostgresOutboxStore(pool, { listenBackoffMs: 2 ** 32, listenMaxBackoffMs: 2 ** 32 }),
    ).toThrow(SequenceOptionsError);
  });

  it('gives a LISTEN connection given as a URL the timeouts and keep-alive of the pool defaults', () => {
    const url = 'postgres://postgres@127.0.0.1:5432/listen';
    expect(resolvePostgresOutboxOptions({ listenConnection: url }).listenConnection).toEqual({
      connectionString: url,
      application_name: 'nest-sequence',
      connectionTimeoutMillis: 30_000,
      query_timeout: 60_000,
      keepAlive: true,
      keepAliveInitialDelayMillis: 10_000,
    });
    const own = { connectionString: url, keepAlive: false };
    expect(resolvePostgresOutboxOptions({ listenConnection: own }).listenConnection).toEqual(own);
  });

  it('refuses a listenBackoffMs of Infinity', () => {
    expect(
      () =>
        new PostgresOutboxStore(pool, { listenBackoffMs: Infinity, listenMaxBackoffMs: Infinity }),
    ).toThrow(SequenceOptionsError);
  });

  it('refuses a misspelt tablePrefix instead of using the unprefixed tables', () => {
    expect(
      () =>
        new PostgresOutboxStore(
          pool,
          untyped<PostgresOutboxStoreOptions>({ tablePrefx: 'billing_' }),
        ),
    ).toThrow(SequenceOptionsError);
  });
});
