import { randomBytes, randomUUID } from 'node:crypto';
import { Socket } from 'node:net';
import type { LoggerService } from '@nestjs/common';
import { AmqpConnection } from '@golevelup/nestjs-rabbitmq';
import * as amqplib from 'amqplib';
import { Redis } from 'ioredis';
import { readAll, sequenceFixture } from '../testing/conformance/sequence-store.conformance';
import { eventually } from '../testing/conformance/transport.conformance';
import { directReadsConnections } from '../../test/support/direct-reads-connections';
import { LibraryAccesses } from '../../test/support/library-accesses';
import { describeWithServer, SERVERS } from '../../test/support/servers';
import { amqpConnection } from '../../test/support/rabbitmq.fixture';
import { redisClient } from '../../test/support/redis.fixture';
import { RedisPayloadStore } from './payload/redis/redis.payload-store';
import { RedisClaimLedger } from './stores/redis/redis.claim-ledger';
import { RedisResequencerStore } from './stores/redis/redis.resequencer-store';
import { RedisSequenceStore } from './stores/redis/redis.sequence-store';
import { framesCoalesced } from './transports/rabbitmq/amqp-frame-writes';
import { RabbitMqTransport } from './transports/rabbitmq/rabbitmq.transport';

/**
 * What the socket tricks do to a socket: cork it, write to it past its owner, take its replies
 * over. The library's own calls of these on any socket are recorded.
 */
const SOCKET_METHODS = ['cork', 'uncork', 'write', 'on', 'once', 'removeAllListeners'] as const;

const KiB = 1024;

const silent: LoggerService = {
  log: () => undefined,
  error: () => undefined,
  warn: () => undefined,
};

/**
 * Without `unsafeSocketTricks`, real round trips through every adapter that has a socket trick
 * must leave the client libraries' private fields unread and their sockets untouched by this
 * library. Each case runs again with the option on, under the same watch, to show the watch
 * would see the tricks if they ran.
 */
describe('unsafeSocketTricks off (the default): public APIs of other libraries only', () => {
  describeWithServer('rabbitmq', 'RabbitMqTransport (RabbitMQ at AMQP_URL)', () => {
    let admin: amqplib.ChannelModel;

    beforeAll(async () => {
      admin = await amqpConnection();
    });

    afterAll(async () => {
      await admin.close();
    });

    /** Publishes and consumes 50 messages on a connection whose internals are watched. */
    async function publishAndConsume(unsafeSocketTricks: boolean) {
      const amqp = new AmqpConnection({
        uri: SERVERS.rabbitmq.url,
        enableDirectReplyTo: false,
        registerHandlers: false,
        logger: silent,
      });
      await amqp.init();
      const model = amqp.managedConnection.connection!;
      const accesses = new LibraryAccesses()
        .property(model.connection, 'muxer', 'amqplib Connection.muxer')
        .property(model.connection, 'accept', 'amqplib Connection.accept')
        .property(model.connection, 'rest', 'amqplib Connection.rest')
        .methods(Socket.prototype, SOCKET_METHODS, 'Socket');
      const channel = `socket-tricks.${randomUUID()}`;
      const transport = new RabbitMqTransport(amqp, { unsafeSocketTricks });
      try {
        const received: string[] = [];
        const subscription = await transport.subscribe(channel, (message) => {
          received.push(message.body.toString());
          return Promise.resolve({ action: 'ack' });
        });
        const sent = Array.from({ length: 50 }, (_, index) => `message ${index}`);
        await Promise.all(sent.map((body) => transport.publish(channel, Buffer.from(body), {})));
        await eventually(() => received.length === sent.length, 'every message');
        expect([...received].sort()).toEqual([...sent].sort());
        await subscription.close();
      } finally {
        accesses.restore();
        await transport.close();
        const cleanup = await admin.createChannel();
        await cleanup.deleteQueue(channel);
        await cleanup.deleteQueue(`${channel}.dlq`);
        await cleanup.close();
      }
      const coalesced = framesCoalesced(model);
      await amqp.close();
      return { log: accesses.log, coalesced };
    }

    it("reads and patches none of amqplib's internals, and takes over no socket", async () => {
      const { log, coalesced } = await publishAndConsume(false);
      expect(log).toEqual([]);
      expect(coalesced).toBe(false);
    });

    it('with unsafeSocketTricks, the same watch sees the multiplexer patched (the control)', async () => {
      const { log, coalesced } = await publishAndConsume(true);
      expect(coalesced).toBe(true);
      expect(log).toEqual(
        expect.arrayContaining([
          expect.stringMatching(/^read amqplib Connection\.muxer at .*amqp-frame-writes\.ts/),
          expect.stringMatching(/^called Socket\.cork\(\) at .*amqp-frame-writes\.ts/),
          expect.stringMatching(/^wrote amqplib Connection\.accept at .*amqp-content-reads\.ts/),
        ]),
      );
    });
  });

  describeWithServer('redis', 'Redis stores (Redis at REDIS_URL)', () => {
    let admin: Redis;

    beforeAll(() => {
      admin = redisClient();
    });

    afterAll(async () => {
      await admin.quit();
    });

    async function deleteUnder(prefix: string): Promise<void> {
      let cursor = '0';
      do {
        const [next, keys] = await admin.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
        if (keys.length > 0) await admin.del(...keys);
        cursor = next;
      } while (cursor !== '0');
    }

    /**
     * A round trip through each Redis adapter on one client whose internals are watched: a
     * sequence of large bodies stored and read back (staged writes; over 1 MiB, so direct reads
     * when on), a 2 MiB payload parked and read back, a resequenced event, a claim.
     */
    async function roundTrips(unsafeSocketTricks: boolean) {
      const name = `nseq-test-${randomUUID()}`;
      const client = redisClient({ connectionName: name });
      await client.ping();
      const accesses = new LibraryAccesses()
        .property(client, 'stream', 'ioredis Redis.stream')
        .property(client, 'condition', 'ioredis Redis.condition')
        .methods(Socket.prototype, SOCKET_METHODS, 'Socket');
      const prefix = `nseq-test:${randomUUID()}`;
      const now = Date.now();
      const options = { prefix, unsafeSocketTricks };
      const sequences = new RedisSequenceStore(client, { ...options, readPieceBytes: 64 * KiB });
      const payloads = new RedisPayloadStore(client, options);
      const resequencer = new RedisResequencerStore(client, options);
      const ledger = new RedisClaimLedger(client, options);
      let readConnections = 0;
      try {
        const bodies = [randomBytes(600 * KiB), randomBytes(600 * KiB), randomBytes(7)];
        const { fragments, ref, payload } = sequenceFixture(`tricks.${randomUUID()}`, bodies);
        for (const fragment of fragments) {
          await sequences.accept(fragment, {
            now,
            consumerId: 'consumer-a',
            leaseMs: 30_000,
            expiry: { ms: 60_000, strategy: 'fixed' },
            retentionMs: 60_000,
            limits: {
              maxSequenceBytes: 16 * 1024 * KiB,
              maxFragments: 10,
              maxBufferedBytes: 16 * 1024 * KiB,
              maxOpenSequences: 10,
            },
          });
        }
        expect(Buffer.concat(await readAll(sequences.read(ref))).equals(payload)).toBe(true);

        const parked = randomBytes(2 * 1024 * KiB);
        const stored = await payloads.put(parked, {
          now,
          expiresAt: now + 60_000,
          published: true,
        });
        expect(Buffer.concat(await readAll(await payloads.get(stored.ref))).equals(parked)).toBe(
          true,
        );
        readConnections = (await directReadsConnections(admin, name)).length;

        const key = { scope: `tricks.${randomUUID()}`, key: 'order-1' };
        const accepted = await resequencer.accept(
          key,
          { seq: 1, body: Buffer.from('event'), headers: {} },
          { start: 1, now, limits: { maxBufferedPerKey: 10, maxBufferedTotal: 10 } },
        );
        expect(accepted.kind).toBe('released');

        const claim = { ticket: `redis:${randomUUID()}`, group: 'tricks' };
        await expect(ledger.claim(claim, 'holder-a', 30_000, now)).resolves.toBe('claimed');
        await ledger.complete(claim, 'holder-a', now + 60_000, now);
      } finally {
        accesses.restore();
        await Promise.all([sequences, payloads, resequencer, ledger].map((store) => store.close()));
        await deleteUnder(prefix);
        await client.quit();
      }
      return { log: accesses.log, readConnections };
    }

    it("reads none of ioredis's internals, and corks, writes to or takes over no socket", async () => {
      const { log, readConnections } = await roundTrips(false);
      expect(log).toEqual([]);
      expect(readConnections).toBe(0);
    });

    it('with unsafeSocketTricks, the same watch sees every trick at work (the control)', async () => {
      const { log, readConnections } = await roundTrips(true);
      expect(readConnections).toBe(2); // one per store that reads: sequences and payloads
      expect(log).toEqual(
        expect.arrayContaining([
          expect.stringMatching(/^read ioredis Redis\.stream at .*redis-command-writes\.ts/),
          expect.stringMatching(/^called Socket\.cork\(\) at .*redis-command-writes\.ts/),
          expect.stringMatching(/^called Socket\.write\(…\) at .*redis-body\.writer\.ts/),
          expect.stringMatching(
            /^called Socket\.removeAllListeners\('data'\) at .*redis-direct-reads\.ts/,
          ),
          expect.stringMatching(/^called Socket\.on\('data'\) at .*redis-direct-reads\.ts/),
        ]),
      );
    });
  });
});
