import { Redis, type RedisOptions } from 'ioredis';
import { RedisClaimLedger, RedisPayloadStore } from 'nest-sequence/redis';
import { SERVERS } from '../support/servers';
import { eventually } from '../support/sequence-test-app';
import {
  createClaimCheckApp,
  generatedPayload,
  type ClaimCheckApp,
} from './support/claim-check.app';
import { singleMetricValue } from './support/metrics';
import { OwnedRedisServer } from '../support/processes/owned-redis.server';
import { RabbitMqAdmin } from '../support/rabbitmq.fixture';
import { describeOnRealServers } from './support/real-servers';
import { deleteUnder, keysUnder, newPrefix, redisClient } from '../support/redis.fixture';

jest.setTimeout(30_000);

const MIB = 1024 * 1024;

/**
 * The consumer's ioredis settings for an outage (as in redis-outage.spec.ts): fail a command at
 * once while disconnected, give up on a server that hangs, keep reconnecting quickly. Without
 * them a read waits in ioredis's queue while Redis is away, and the message with it.
 */
const FAIL_FAST: RedisOptions = {
  maxRetriesPerRequest: 1,
  enableOfflineQueue: false,
  connectTimeout: 500,
  commandTimeout: 500,
  retryStrategy: (attempt) => Math.min(50 * attempt, 200),
};

/**
 * Guarantees table, row "store unreachable", for Claim Check: the payload store's Redis is a
 * redis-server the test owns, stopped or frozen while a ticket waits or is being read; the claim
 * ledger stays on the shared Redis, so the failure is the payload store's alone.
 */
describeOnRealServers(
  'faults: the Redis payload store stopped under a claim check consumer',
  () => {
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

    /** A producer whose payload store is on the owned server (in chunks of `chunkBytes`). */
    async function startProducer(chunkBytes?: number): Promise<ClaimCheckApp> {
      const producer = await createClaimCheckApp({
        store: RedisPayloadStore.connect(server!.url, { prefix, chunkBytes }),
        ledger: RedisClaimLedger.connect(SERVERS.redis.url, { prefix }),
      });
      apps.push(producer);
      return producer;
    }

    /** A consumer of `channel` whose payload store client fails fast while the server is away. */
    async function startConsumer(): Promise<ClaimCheckApp> {
      owned = new Redis(server!.url, FAIL_FAST);
      const consumer = await createClaimCheckApp({
        store: new RedisPayloadStore(owned, { prefix }),
        ledger: RedisClaimLedger.connect(SERVERS.redis.url, { prefix }),
        consume: { channel },
        backpressureDelayMs: 100,
      });
      apps.push(consumer);
      return consumer;
    }

    const ticketsReceived = (app: ClaimCheckApp) =>
      singleMetricValue(app.registry, 'nest_sequence_claim_check_messages_received_total', {
        channel,
        via: 'ticket',
      });

    /** Waits until `app` has taken the ticket `times` more times; none dead-lettered, none handled. */
    async function expectRequeuedWhileDown(app: ClaimCheckApp, times: number): Promise<void> {
      const before = await ticketsReceived(app);
      await eventually(
        async () => (await ticketsReceived(app)) >= before + times,
        `the ticket taken ${times} more times`,
        10_000,
      );
      const { ready, unacked } = await admin.totalCount(channel);
      // In the queue or in the consumer's hands; during a requeue the copy at the tail and the
      // original can both be counted for a moment.
      expect(ready + unacked).toBeGreaterThanOrEqual(1);
      expect(ready + unacked).toBeLessThanOrEqual(2);
      expect(await admin.readyCount(`${channel}.dlq`)).toBe(0);
      expect(app.handler.deliveries).toEqual([]);
    }

    async function expectDeliveredOnce(
      consumer: ClaimCheckApp,
      payload: { sha256: string; bytes: number },
      ref: string,
    ): Promise<void> {
      await eventually(() => consumer.handler.deliveries.length === 1, 'the delivery', 10_000);
      await eventually(async () => (await admin.readyCount(channel)) === 0, 'the queue drained');
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(consumer.handler.deliveries).toHaveLength(1);
      expect(consumer.handler.deliveries[0]).toMatchObject({
        bytes: payload.bytes,
        sha256: payload.sha256,
      });
      expect(await admin.readyCount(`${channel}.dlq`)).toBe(0);
      // deleteAfter 'ack': gone from the owned server once handled.
      expect(
        (await keysUnder(owned!, prefix)).filter((key) => key.includes(`{payload:${ref}}`)),
      ).toEqual([]);
    }

    it('requeues a ticket while its payload store is down (never dead-letters it), and delivers it once after Redis restarts with its append-only file', async () => {
      server = await OwnedRedisServer.start({ appendOnly: true });
      const producer = await startProducer();
      const payload = generatedPayload(3 * MIB, 51);
      const { ticket } = await producer.claimCheck.publish(channel, payload.stream());

      await server.stop('SIGKILL');
      const consumer = await startConsumer();
      await expectRequeuedWhileDown(consumer, 3);
      expect(consumer.handler.calls).toBe(0);
      await server.restart();

      await expectDeliveredOnce(consumer, payload, ticket!.ref);
      expect(consumer.handler.calls).toBe(1);
    });

    it('requeues a ticket whose payload store froze (SIGSTOP) in the middle of the read, and delivers it once after Redis resumes', async () => {
      server = await OwnedRedisServer.start({ appendOnly: false });
      // 64 KiB chunks: the read is 32 round trips, so the freeze lands in the middle of it.
      const producer = await startProducer(64 * 1024);
      const payload = generatedPayload(2 * MIB, 52);
      const consumer = await startConsumer();
      let frozenAt: number | undefined;
      consumer.handler.onChunk = (bytesRead) => {
        if (frozenAt === undefined && bytesRead >= 256 * 1024) {
          frozenAt = bytesRead;
          server!.pause();
        }
      };

      // Not awaited yet: should the freeze come before the producer marked the payload published,
      // publish() resolves only after the resume.
      const published = producer.claimCheck.publish(channel, payload.stream());
      await eventually(() => frozenAt !== undefined, 'the read under way', 10_000);
      await expectRequeuedWhileDown(consumer, 2);
      expect(consumer.handler.calls).toBe(1);
      server.resume();

      const { ticket } = await published;
      await expectDeliveredOnce(consumer, payload, ticket!.ref);
      // The read cut short, then the whole one: no call in between (the store failed before it).
      expect(consumer.handler.calls).toBe(2);
    });
  },
);
