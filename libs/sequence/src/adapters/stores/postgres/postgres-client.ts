import type { Client, ClientConfig, Pool, PoolClient, PoolConfig } from 'pg';
import { closeOrDrop } from '../../../core/async';
import { PostgresOutboxError } from './postgres-outbox.error';

/**
 * `pg`, loaded here rather than at the top of a module: it is an optional peer of the library,
 * which must load without it when PostgreSQL is not used.
 */
export function loadPg(): typeof import('pg') {
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    return require('pg') as typeof import('pg');
  } catch (error) {
    throw new PostgresOutboxError(
      'load',
      'the PostgreSQL outbox store needs the `pg` package: install it (npm install pg)',
      { cause: error },
    );
  }
}

/** A pool of `PostgresOutboxStore.connect`'s own, and how to end it. */
export interface OwnedPool {
  readonly pool: Pool;
  /**
   * Ends the pool: waits for the connections in use to be handed back (a statement on a server
   * that stopped answering ends at the pool's `query_timeout`), then for every connection to
   * close. pg-pool's `end()` resolves while the idle ones still wait for the server to close its
   * side, which a server that stopped answering never does: those not closed within
   * `POLITE_CLOSE_MS` are dropped, since a socket left waiting would keep the process alive.
   */
  end(): Promise<void>;
}

/** A new pool for `connectionString`, for `PostgresOutboxStore.connect` (which then owns it). */
export function newOwnedPool(connectionString: string, config: PoolConfig = {}): OwnedPool {
  const { Pool: PoolClass } = loadPg();
  const pool = new PoolClass({ ...config, connectionString });
  const connections = new Set<PoolClient>();
  pool.on('connect', (client) => connections.add(client));
  pool.on('remove', (client) => connections.delete(client));
  const allClosed = () =>
    new Promise<void>((resolve) => {
      const check = () => {
        if (connections.size > 0) return;
        pool.off('remove', check);
        resolve();
      };
      pool.on('remove', check);
      check();
    });
  return {
    pool,
    end: async () => {
      await pool.end();
      await closeOrDrop(allClosed, () => connections.forEach(dropConnection));
    },
  };
}

/** Ends `client`'s connection, or drops it when the server does not close its side in time. */
export function endClient(client: Client): Promise<void> {
  return closeOrDrop(
    () => client.end(),
    () => dropConnection(client),
  );
}

/** Closes `client`'s socket without a word to the server (pg's `end()` waits for its reply). */
function dropConnection(client: Client): void {
  client.connection.stream.destroy();
}

/** A new, not yet connected, client (the store's LISTEN connection, the migrate CLI). */
export function newClient(config: ClientConfig): Client {
  const { Client: ClientClass } = loadPg();
  return new ClientClass(config);
}

/**
 * A client of `pool`, with `onError` listening from the moment the pool hands it over.
 *
 * pg-pool removes its own 'error' listener from a client it hands over, and it may hand one over
 * from inside the previous holder's query callback, while pg is still reading that socket. An
 * `await pool.connect()` resumes only after that read: an error the server sent in the same read
 * (FATAL 57P01 from a shutting-down server, right behind the previous statement's reply) would be
 * an 'error' event nobody hears, which ends the process. The callback form of `connect` runs at
 * the hand-over itself, so the listener is in place before pg reads on.
 */
export function checkOut(pool: Pool, onError: (error: Error) => void): Promise<PoolClient> {
  return new Promise((resolve, reject) => {
    pool.connect((error, client) => {
      if (error || !client) {
        reject(error ?? new Error('the pool handed over no client'));
        return;
      }
      client.on('error', onError);
      resolve(client);
    });
  });
}
