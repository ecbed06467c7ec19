import { readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'amqplib';
import { Redis, type RedisOptions } from 'ioredis';
import { Pool } from 'pg';
import { sparePort } from '../../test/support/processes/server-process';
import { describeWithServer, SERVERS } from '../../test/support/servers';
import { BrokerUnavailableError } from '../core/errors/broker-unavailable.error';
import { ClaimLedgerTimeoutError } from '../core/errors/claim-ledger-timeout.error';
import { PayloadReadTimeoutError } from '../core/errors/payload-read-timeout.error';
import { PayloadStoreTimeoutError } from '../core/errors/payload-store-timeout.error';
import { ResequencerStoreTimeoutError } from '../core/errors/resequencer-store-timeout.error';
import { SequenceStoreTimeoutError } from '../core/errors/sequence-store-timeout.error';
import { isUnavailable } from './unavailable';

/** What `run` rejects with (it must reject). */
async function rejectionOf(run: () => Promise<unknown>): Promise<unknown> {
  try {
    await run();
  } catch (error) {
    return error;
  }
  throw new Error('it did not reject');
}

/** What a command of an ioredis client with `options`, pointed at a closed port, rejects with. */
async function redisDownError(options: RedisOptions): Promise<unknown> {
  const client = new Redis(`redis://127.0.0.1:${await sparePort()}`, {
    retryStrategy: () => 20,
    ...options,
  });
  client.on('error', () => undefined);
  try {
    return await rejectionOf(() => client.get('key'));
  } finally {
    client.disconnect();
  }
}

describe('isUnavailable over what the clients throw with their server away', () => {
  it('tells a command ioredis gave up after maxRetriesPerRequest reconnections', async () => {
    const error = await redisDownError({ maxRetriesPerRequest: 1 });
    expect(error).toMatchObject({ name: 'MaxRetriesPerRequestError' });
    expect(isUnavailable(error)).toBe(true);
  });

  it('tells a command ioredis refused without an offline queue', async () => {
    const error = await redisDownError({ enableOfflineQueue: false });
    expect(isUnavailable(error)).toBe(true);
  });

  it('tells a command on an ioredis client that stopped reconnecting', async () => {
    const client = new Redis(`redis://127.0.0.1:${await sparePort()}`, {
      retryStrategy: () => null,
      lazyConnect: true,
    });
    client.on('error', () => undefined);
    await rejectionOf(() => client.connect());
    const error = await rejectionOf(() => client.get('key'));
    client.disconnect();
    expect(error).toMatchObject({ message: 'Connection is closed.' });
    expect(isUnavailable(error)).toBe(true);
  });

  it('tells a pg pool refused a connection, also as the cause of another error', async () => {
    const pool = new Pool({
      connectionString: `postgres://postgres@127.0.0.1:${await sparePort()}/test`,
    });
    const error = await rejectionOf(() => pool.query('SELECT 1'));
    await pool.end();
    expect(error).toMatchObject({ code: 'ECONNREFUSED' });
    expect(isUnavailable(error)).toBe(true);
    expect(isUnavailable(new Error('listing the outbox failed', { cause: error }))).toBe(true);
  });

  it("tells a transport's BrokerUnavailableError, also as the cause of another error", () => {
    for (const reason of ['reconnecting', 'blocked', 'not-answering'] as const) {
      const error = new BrokerUnavailableError('rabbitmq', reason, 'the broker is away');
      expect(isUnavailable(error)).toBe(true);
      expect(isUnavailable(new Error('listing failed', { cause: error }))).toBe(true);
    }
    // The same words from elsewhere are no outage: only the type says so.
    expect(isUnavailable(new Error('not connected to RabbitMQ (reconnecting)'))).toBe(false);
  });

  it("tells the module's errors for a store that did not answer in time, also as a cause", () => {
    for (const error of [
      new SequenceStoreTimeoutError('redis', 'listOpen', 'orders', 500),
      new ResequencerStoreTimeoutError('redis', 'inspect', 'prices/K', 500),
      new PayloadReadTimeoutError('redis', 'ref-1', 'open', 500),
      new PayloadStoreTimeoutError('redis', '', 'put', 500),
      new ClaimLedgerTimeoutError('redis', 'claim', 'ticket', 'orders', 500, 'tuning.leaseMs'),
    ]) {
      expect({ error: error.name, unavailable: isUnavailable(error) }).toEqual({
        error: error.name,
        unavailable: true,
      });
      expect(isUnavailable(new Error('listing failed', { cause: error }))).toBe(true);
    }
  });

  it('does not take an error that is no outage for one', () => {
    expect(isUnavailable(new Error('route of event x gave no channel'))).toBe(false);
    expect(isUnavailable(new TypeError("Cannot read properties of undefined (reading 'id')"))).toBe(
      false,
    );
    expect(isUnavailable('Connection is closed.')).toBe(false);
    expect(isUnavailable(undefined)).toBe(false);
  });
});

describeWithServer('postgres', 'isUnavailable over what a reachable PostgreSQL answers', () => {
  let pool: Pool;

  beforeAll(() => {
    pool = new Pool({ connectionString: SERVERS.postgres.url, max: 2 });
    pool.on('error', () => undefined);
  });

  afterAll(() => pool.end());

  it('tells a connection the server terminated (57P01)', async () => {
    const client = await pool.connect();
    client.on('error', () => undefined);
    const error = await rejectionOf(() =>
      client.query('SELECT pg_terminate_backend(pg_backend_pid())'),
    );
    client.release(true);
    expect(error).toMatchObject({ code: '57P01' });
    expect(isUnavailable(error)).toBe(true);
  });

  it('does not take a statement that fails on a working connection for an outage', async () => {
    const error = await rejectionOf(() => pool.query('SELECT * FROM no_such_table_nseq'));
    expect(error).toMatchObject({ code: '42P01' });
    expect(isUnavailable(error)).toBe(false);
  });
});

describeWithServer('redis', 'isUnavailable over what a reachable Redis answers', () => {
  it('does not take an error reply for an outage', async () => {
    const client = new Redis(SERVERS.redis.url);
    try {
      const error = await rejectionOf(() => client.call('NO-SUCH-COMMAND-NSEQ'));
      expect(error).toMatchObject({ name: 'ReplyError' });
      expect(isUnavailable(error)).toBe(false);
    } finally {
      client.disconnect();
    }
  });
});

describe('isUnavailable over file-system errors', () => {
  it('does not take a file that cannot be read for an outage (a misconfiguration, not "later")', async () => {
    const directory = await rejectionOf(() => readFile(tmpdir()));
    const missing = await rejectionOf(() => readFile(join(tmpdir(), 'no-such-file-nseq')));
    expect(directory).toMatchObject({ code: 'EISDIR' });
    expect(missing).toMatchObject({ code: 'ENOENT' });
    expect(isUnavailable(directory)).toBe(false);
    expect(isUnavailable(missing)).toBe(false);
  });
});

describeWithServer('rabbitmq', 'isUnavailable over what amqplib throws', () => {
  it('tells a call the connection dropped under, and a channel asked of a closed connection', async () => {
    const connection = await connect(SERVERS.rabbitmq.url);
    connection.on('error', () => undefined);
    const channel = await connection.createChannel();
    channel.on('error', () => undefined);
    const pending = rejectionOf(() => channel.checkExchange('amq.direct'));
    // The socket lost, as in a network outage: the call's reply never comes.
    const socket = (connection.connection as unknown as { stream: { destroy(e: Error): void } })
      .stream;
    socket.destroy(Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' }));
    const dropped = await pending;
    expect(dropped).toMatchObject({ message: expect.stringMatching(/^Channel ended/) });
    expect(isUnavailable(dropped)).toBe(true);
    const closed = await rejectionOf(() => connection.createChannel());
    expect(closed).toMatchObject({ message: expect.stringMatching(/^Connection closed/) });
    expect(isUnavailable(closed)).toBe(true);
  });

  it('does not take a channel the broker closed for what was asked of it for an outage', async () => {
    const connection = await connect(SERVERS.rabbitmq.url);
    try {
      const channel = await connection.createChannel();
      channel.on('error', () => undefined);
      const refused = await rejectionOf(() => channel.checkQueue('no-such-queue-nseq'));
      const afterwards = await rejectionOf(() => channel.checkQueue('no-such-queue-nseq'));
      expect(refused).toMatchObject({ code: 404 });
      expect(afterwards).toMatchObject({ name: 'IllegalOperationError' });
      expect(isUnavailable(refused)).toBe(false);
      expect(isUnavailable(afterwards)).toBe(false);
    } finally {
      await connection.close();
    }
  });
});
