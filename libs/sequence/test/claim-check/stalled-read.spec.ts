import { Redis } from 'ioredis';
import { SequenceOptionsError, SplitterService } from 'nest-sequence';
import { PayloadReadTimeoutError } from 'nest-sequence/ports';
import { RedisPayloadStore } from 'nest-sequence/redis';
import type { ClaimTicket } from 'nest-sequence/wire';
import { FreezingProxy, redisThroughProxy } from '../support/freezing-proxy';
import { useRedis } from '../support/redis.fixture';
import { bytes } from '../support/sequence-test-app';
import { describeWithServer } from '../support/servers';
import {
  createClaimCheckTestApp,
  deathReasons,
  publishTicket,
  type ClaimCheckTestApp,
  type ClaimCheckTestAppOptions,
} from './claim-check-test-app';
import { FaultInjectingPayloadStore } from './fault-injecting.payload-store';

const READ_TIMEOUT_MS = 300;

/**
 * Claim Check: a payload store that stops answering mid-read (a stalled S3 GET, a Redis that no
 * longer replies) must not hold the message, and its prefetch slot, for ever. Each step of a read
 * (the head, opening the payload, each next chunk) waits at most `claimCheck.readTimeoutMs`; then
 * the read fails with PayloadReadTimeoutError, the message is requeued as for any store outage,
 * and after `tuning.maxStoreRequeues` it is dead-lettered `store-unavailable` with that reason.
 */
describe('claim check: a payload store read that never answers', () => {
  const payload = bytes(200 * 1024, 7);
  let t: ClaimCheckTestApp | undefined;
  let store: FaultInjectingPayloadStore;
  let ticket: ClaimTicket;

  async function boot(options: Partial<ClaimCheckTestAppOptions> = {}): Promise<ClaimCheckTestApp> {
    t = await createClaimCheckTestApp({
      ...options,
      claimCheck: { readTimeoutMs: READ_TIMEOUT_MS, inlineMaxBytes: 1024, ...options.claimCheck },
      wrapStore: (inner) => (store = new FaultInjectingPayloadStore(inner)),
    });
    ticket = await t.claimCheck.checkIn(payload, { audience: t.channel });
    return t;
  }
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('a get that never resolves: the read fails PayloadReadTimeoutError, the ticket is requeued, then delivered', async () => {
    const app = await boot();
    store.hangGets = 1;
    await publishTicket(app.transport, app.channel, ticket);
    await app.transport.whenIdle();

    expect(app.transport.actionsOn(app.channel)).toEqual(['requeue', 'ack']);
    expect(app.handler.readErrors).toHaveLength(1);
    const error = app.handler.readErrors[0] as PayloadReadTimeoutError;
    expect(error).toBeInstanceOf(PayloadReadTimeoutError);
    expect(error).toMatchObject({
      code: 'payload-read-timeout',
      store: 'filesystem',
      ref: ticket.ref,
      timeoutMs: READ_TIMEOUT_MS,
      waitingFor: 'open',
    });
    expect(app.handler.deliveries).toHaveLength(1);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });

  it('a stream that stalls after its first chunk: the read fails, the stalled stream is destroyed, then delivered', async () => {
    const app = await boot();
    store.stallStreams = 1;
    await publishTicket(app.transport, app.channel, ticket);
    await app.transport.whenIdle();

    expect(app.transport.actionsOn(app.channel)).toEqual(['requeue', 'ack']);
    expect(app.handler.readErrors[0]).toBeInstanceOf(PayloadReadTimeoutError);
    expect(app.handler.readErrors[0]).toMatchObject({ waitingFor: 'next chunk' });
    expect(store.stalled).toHaveLength(1);
    expect(store.stalled[0].destroyed).toBe(true);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });

  it('a slow handler is not a stalled store: only the wait on the store is bounded', async () => {
    const app = await boot();
    app.handler.read = async (claimed) => {
      const chunks: Buffer[] = [];
      for await (const chunk of claimed.stream()) {
        chunks.push(chunk as Buffer);
        await new Promise((resolve) => setTimeout(resolve, 2 * READ_TIMEOUT_MS));
      }
      return Buffer.concat(chunks);
    };
    await publishTicket(app.transport, app.channel, ticket);
    await app.transport.whenIdle();

    expect(app.transport.actionsOn(app.channel)).toEqual(['ack']);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });

  it('checkOut by hand: a stalled read fails PayloadReadTimeoutError, and a later read succeeds', async () => {
    const app = await boot();
    store.stallStreams = 1;
    const claimed = await app.claimCheck.checkOut(ticket);

    await expect(claimed.toBuffer()).rejects.toBeInstanceOf(PayloadReadTimeoutError);
    expect(claimed.readFailure).toBeInstanceOf(PayloadReadTimeoutError);
    expect(store.stalled[0].destroyed).toBe(true);
    expect((await claimed.toBuffer()).equals(payload)).toBe(true);
    expect(claimed.readFailure).toBeUndefined();
  });

  it('a head that never resolves: requeued, then delivered', async () => {
    const app = await boot();
    store.hangHeads = 1;
    await publishTicket(app.transport, app.channel, ticket);
    await app.transport.whenIdle();

    expect(app.transport.actionsOn(app.channel)).toEqual(['requeue', 'ack']);
    expect(app.handler.calls).toBe(1);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });

  it('a store that never answers: dead-lettered store-unavailable after maxStoreRequeues, naming the timeout', async () => {
    const app = await boot({ module: { tuning: { maxStoreRequeues: 2 } } });
    store.hangGets = 1_000;
    await publishTicket(app.transport, app.channel, ticket);
    await app.transport.whenIdle();

    expect(app.transport.actionsOn(app.channel)).toEqual(['requeue', 'requeue', 'dead-letter']);
    expect(deathReasons(app.transport, app.channel)).toEqual([
      expect.stringMatching(
        new RegExp(
          '^store-unavailable: payload store unavailable after 2 requeues of the message .*' +
            `did not open payload .* within ${READ_TIMEOUT_MS} ms \\(claimCheck\\.readTimeoutMs\\)`,
        ),
      ),
    ]);
    // Kept for the dead letter to be published again once the store answers.
    expect(await app.store.head(ticket.ref)).toBeDefined();
  });

  it('a fragment sent via claim check whose parked body never comes: requeued, then reassembled', async () => {
    const app = await boot();
    store.hangGets = 1;
    await app.app.get(SplitterService).send(app.channel, payload, {
      via: 'claim-check',
      fragmentBytes: 64 * 1024,
    });
    await app.transport.whenIdle();

    const actions = app.transport.actionsOn(app.channel);
    expect(actions.filter((action) => action === 'requeue')).toHaveLength(1);
    expect(actions.filter((action) => action === 'dead-letter')).toHaveLength(0);
    expect(app.handler.deliveries).toHaveLength(1);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });

  it.each([
    [0, 'claimCheck.readTimeoutMs must be an integer >= 1, got 0'],
    [1.5, 'claimCheck.readTimeoutMs must be an integer >= 1, got 1.5'],
  ])('readTimeoutMs %p: refused at boot', async (readTimeoutMs, problem) => {
    const error: unknown = await createClaimCheckTestApp({ claimCheck: { readTimeoutMs } }).then(
      async (app) => {
        await app.close();
        return undefined;
      },
      (rejection: unknown) => rejection,
    );
    expect(error).toBeInstanceOf(SequenceOptionsError);
    expect((error as SequenceOptionsError).problems).toEqual([problem]);
  });
});

/**
 * The same against a real store: a RedisPayloadStore whose connection to the real Redis goes
 * through a proxy that freezes mid-read (the server stops answering; nothing is refused or reset,
 * and ioredis has no command timeout of its own).
 */
describeWithServer(
  'redis',
  'claim check: a Redis payload store that stops answering mid-read',
  () => {
    const redis = useRedis({ stem: 'nseq-test-stall' });
    let proxy: FreezingProxy | undefined;
    let client: Redis | undefined;
    let t: ClaimCheckTestApp | undefined;
    afterEach(async () => {
      await t?.close();
      client?.disconnect();
      await proxy?.close();
      t = client = proxy = undefined;
    });

    it('the read fails after readTimeoutMs, the message is requeued, then dead-lettered store-unavailable', async () => {
      ({ proxy, client } = await redisThroughProxy(redis.client.options.port!));
      const store = new RedisPayloadStore(client, {
        prefix: redis.prefix,
        chunkBytes: 4 * 1024,
        readAheadChunks: 1,
      });
      const app = (t = await createClaimCheckTestApp({
        claimCheck: { readTimeoutMs: 200, inlineMaxBytes: 1024 },
        module: { tuning: { maxStoreRequeues: 1 } },
        wrapStore: () => store,
      }));
      const payload = bytes(256 * 1024, 3);
      const ticket = await app.claimCheck.checkIn(payload, { audience: app.channel });
      const frozen = proxy;
      app.handler.read = async (claimed) => {
        const chunks: Buffer[] = [];
        for await (const chunk of claimed.stream()) {
          chunks.push(chunk as Buffer);
          frozen.freeze(); // after the first chunk: Redis answers nothing more
        }
        return Buffer.concat(chunks);
      };
      await publishTicket(app.transport, app.channel, ticket);
      await app.transport.whenIdle();

      expect(app.handler.readErrors).toHaveLength(1);
      expect(app.handler.readErrors[0]).toBeInstanceOf(PayloadReadTimeoutError);
      expect(app.handler.readErrors[0]).toMatchObject({ store: 'redis', waitingFor: 'next chunk' });
      // The redelivery finds Redis still frozen: its head times out, and it is dead-lettered.
      expect(app.transport.actionsOn(app.channel)).toEqual(['requeue', 'dead-letter']);
      expect(deathReasons(app.transport, app.channel)).toEqual([
        expect.stringMatching(
          /^store-unavailable: .*did not answer for payload .* within 200 ms \(claimCheck\.readTimeoutMs\)/,
        ),
      ]);
      // Kept in the store for the dead letter to be published again.
      const direct = new RedisPayloadStore(redis.client, { prefix: redis.prefix });
      expect(await direct.head(ticket.ref)).toMatchObject({ bytes: payload.length });
    });
  },
);
