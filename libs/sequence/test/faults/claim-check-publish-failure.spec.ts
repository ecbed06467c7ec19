import type { PublishPolicy } from '../../src/options/module-options';
import { Redis, type RedisOptions } from 'ioredis';
import { ClaimCheckPublishError, PublishTimeoutError, type PayloadStore } from 'nest-sequence';
import { RedisClaimLedger, RedisPayloadStore } from 'nest-sequence/redis';
import { SERVERS } from '../support/servers';
import { bytes, eventually } from '../support/sequence-test-app';
import { sha256Hex } from '../../src/core/checksum';
import {
  createClaimCheckApp,
  redisClaimCheckAdapters,
  type ClaimCheckApp,
} from './support/claim-check.app';
import { OwnedRedisServer } from '../support/processes/owned-redis.server';
import { RabbitMqAdmin } from '../support/rabbitmq.fixture';
import { describeOnRealServers } from './support/real-servers';
import { deleteUnder, keysUnder, newPrefix, redisClient } from '../support/redis.fixture';

jest.setTimeout(30_000);

const HOUR = 3_600_000;

/**
 * Two tries of 250 ms each, no backoff: with the connection gone for seconds, the ticket's publish
 * has failed for good about half a second after it started.
 */
const SHORT_BUDGET = {
  confirmTimeoutMs: 250,
  retry: { attempts: 2, baseDelayMs: 0, maxDelayMs: 0 },
} satisfies PublishPolicy;
/** Long enough after the drop that the whole budget is spent while disconnected. */
const RECONNECT_SECONDS = 2;

/** ioredis settings that make a command to a frozen server fail within half a second. */
const FAIL_FAST: RedisOptions = {
  maxRetriesPerRequest: 1,
  enableOfflineQueue: false,
  connectTimeout: 500,
  commandTimeout: 500,
  retryStrategy: (attempt) => Math.min(50 * attempt, 200),
};

/**
 * "The payload is stored before the ticket is published; if publishing fails, the stored payload
 * is deleted (or left to the orphan sweeper)". The producer's RabbitMQ connection is made
 * unusable the way an operator or a failover does it: the broker closes it (`rabbitmqctl
 * close_connection`), and the client comes back only after RECONNECT_SECONDS. That is reliable
 * where a race is not: the store write needs no broker and succeeds, and then every publish
 * attempt meets a connection that is gone (queued in the client, or written to a closed socket)
 * and times out, whichever the client has noticed yet. (A 1 ms confirm budget against a healthy
 * broker is not a publish failure at all: the ticket is enqueued, only its confirm is late; see
 * the last test.)
 */
describeOnRealServers('faults: a claim check ticket that cannot be published', () => {
  let admin: RabbitMqAdmin;
  let shared: Redis;
  let server: OwnedRedisServer | undefined;
  let owned: Redis | undefined;
  let prefix: string;
  let channel: string;
  const apps: ClaimCheckApp[] = [];

  beforeAll(async () => {
    admin = await RabbitMqAdmin.connect();
    shared = redisClient();
  });

  beforeEach(() => {
    channel = admin.newChannel();
    prefix = newPrefix();
  });

  afterEach(async () => {
    server?.resume();
    for (const app of apps.splice(0)) await app.close();
    owned?.disconnect();
    await server?.dispose();
    owned = server = undefined;
    await admin.cleanup();
    await deleteUnder(shared, prefix);
  });

  afterAll(async () => {
    await admin.close();
    await shared.quit();
  });

  /** A producer on `store`; its queue is declared and holds one message sent while connected. */
  async function startProducer(store: PayloadStore): Promise<ClaimCheckApp> {
    const producer = await createClaimCheckApp({
      store,
      ledger: RedisClaimLedger.connect(SERVERS.redis.url, { prefix }),
      publish: SHORT_BUDGET,
      reconnectSeconds: RECONNECT_SECONDS,
    });
    apps.push(producer);
    await producer.claimCheck.publish(channel, Buffer.from('sent while connected'));
    return producer;
  }

  /** The error `publish` rejected with, checked to be the typed one for a ticket. */
  async function failedPublish(
    publishing: Promise<unknown>,
    attempts = SHORT_BUDGET.retry.attempts,
  ): Promise<ClaimCheckPublishError> {
    const error: unknown = await publishing.then(
      () => undefined,
      (rejection: unknown) => rejection,
    );
    expect(error).toBeInstanceOf(ClaimCheckPublishError);
    expect(error).toMatchObject({
      name: 'ClaimCheckPublishError',
      code: 'publish-failed',
      channel,
      via: 'ticket',
      attempts,
      payload: expect.stringMatching(/^redis:[0-9a-f-]{36}$/) as string,
    });
    expect((error as ClaimCheckPublishError).cause).toBeInstanceOf(PublishTimeoutError);
    return error as ClaimCheckPublishError;
  }

  const refOf = (error: ClaimCheckPublishError) => error.payload!.slice('redis:'.length);

  it('rejects with ClaimCheckPublishError and deletes the stored payload; no ticket is sent once the connection is back', async () => {
    const producer = await startProducer(RedisPayloadStore.connect(SERVERS.redis.url, { prefix }));
    await admin.closeConnection(producer.connectionName);
    const written: string[] = [];
    const unpublished = `${prefix}:{payload-idx}:unpublished`;

    const publishing = producer.claimCheck.publish(channel, bytes(400_000, 61));
    // The payload really was stored: it is listed as awaiting its ticket's confirm.
    await eventually(async () => {
      written.push(...(await shared.zrange(unpublished, 0, -1)));
      return written.length > 0;
    }, 'the payload stored');
    const error = await failedPublish(publishing);

    expect(written).toEqual([refOf(error)]);
    expect(await keysUnder(shared, prefix)).toEqual([]);
    // Reconnected, the client does not send the ticket it gave up on (it would name nothing).
    await eventually(
      () =>
        producer.transport.ping().then(
          () => true,
          () => false,
        ),
      'reconnected',
      10_000,
    );
    await new Promise((resolve) => setTimeout(resolve, 300));
    const queued = await admin.drain(channel);
    expect(queued.map((message) => message.body.toString())).toEqual(['sent while connected']);
  });

  it('when the delete fails too (Redis frozen), leaves the payload to the orphan sweeper, which removes it once orphanGraceMs has passed', async () => {
    server = await OwnedRedisServer.start({ appendOnly: false });
    const client = new Redis(server.url, FAIL_FAST);
    owned = client;
    const frozen = server;
    // The real store, frozen the moment its put has answered: the payload is written, and every
    // later command (the delete after the failed publish) times out until the resume.
    const store = new RedisPayloadStore(client, { prefix });
    const freezingAfterPut = new Proxy(store, {
      get(target, property) {
        if (property === 'put') {
          return async (...args: Parameters<RedisPayloadStore['put']>) => {
            const stored = await target.put(...args);
            frozen.pause();
            return stored;
          };
        }
        const value: unknown = Reflect.get(target, property, target);
        return typeof value === 'function' ? (value as () => unknown).bind(target) : value;
      },
    });
    const producer = await startProducer(freezingAfterPut);
    await admin.closeConnection(producer.connectionName);

    const error = await failedPublish(producer.claimCheck.publish(channel, bytes(400_000, 62)));
    server.resume();

    const ref = refOf(error);
    const payloadKeys = async () =>
      (await keysUnder(client, prefix)).filter((key) => key.includes(`{payload:${ref}}`));
    expect(await payloadKeys()).not.toEqual([]);
    // Within the grace period the sweeper keeps it: the ticket might still be confirmed.
    expect(await producer.sweeper.sweep(Date.now())).toEqual({ expired: 0, orphaned: 0 });
    expect(await payloadKeys()).not.toEqual([]);

    expect(await producer.sweeper.sweep(Date.now() + HOUR + 1_000)).toEqual({
      expired: 0,
      orphaned: 1,
    });
    expect(await keysUnder(client, prefix)).toEqual([]);
  });

  /**
   * A confirm that did not come in time says nothing about whether the broker has the message.
   * The producer's transport publishes the ticket for real and the broker enqueues it, but the
   * confirm is reported as late: the transport answers with the PublishTimeoutError it gives when
   * the budget ran out after the hand-over. (A 1 ms budget against the live broker made the same
   * case, but not every time: a loopback confirm sometimes comes back within 1 ms.) publish()
   * rejects (maybeDelivered: true) and keeps the payload, so the ticket that did land is served.
   */
  it('a ticket whose confirm timed out but that reached the queue is still served, not dead-lettered', async () => {
    const consumer = await createClaimCheckApp({
      ...redisClaimCheckAdapters(prefix),
      consume: { channel },
    });
    apps.push(consumer);
    const producer = await createClaimCheckApp({
      ...redisClaimCheckAdapters(prefix),
      publish: {
        confirmTimeoutMs: 1,
        retry: {
          attempts: 1,
        },
      },
    });
    apps.push(producer);
    const transport = producer.transport;
    const publish = transport.publish.bind(transport);
    const confirmedLate = jest
      .spyOn(transport, 'publish')
      .mockImplementationOnce(async (to, body, headers) => {
        await publish(to, body, headers, { timeoutMs: 5_000 });
        throw new PublishTimeoutError(to, 1, true);
      });
    const payload = bytes(400_000, 63);

    await failedPublish(producer.claimCheck.publish(channel, payload), 1);
    expect(confirmedLate).toHaveBeenCalledTimes(1);

    const tickets = () => consumer.handler.deliveries.filter(({ via }) => via === 'ticket');
    await eventually(
      async () => tickets().length > 0 || (await admin.readyCount(`${channel}.dlq`)) > 0,
      'the ticket that reached the queue settled',
    );
    const deadLetters = await admin.drain(`${channel}.dlq`);
    expect(deadLetters.map(({ headers }) => String(headers['x-death-reason']))).toEqual([]);
    expect(tickets().map(({ sha256 }) => sha256)).toEqual([sha256Hex(payload)]);
  });
});
