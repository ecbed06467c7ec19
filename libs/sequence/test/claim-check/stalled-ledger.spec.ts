import { createHash } from 'node:crypto';
import { Redis } from 'ioredis';
import { ClaimLeaseLostError } from 'nest-sequence/ports';
import { RedisClaimLedger } from 'nest-sequence/redis';
import type { ClaimTicket } from 'nest-sequence/wire';
import { FreezingProxy, redisThroughProxy } from '../support/freezing-proxy';
import { useRedis } from '../support/redis.fixture';
import { bytes, eventually } from '../support/sequence-test-app';
import { describeWithServer } from '../support/servers';
import {
  createClaimCheckTestApp,
  deathReasons,
  publishTicket,
  signedByApp,
  type ClaimCheckTestApp,
  type ClaimCheckTestAppOptions,
} from './claim-check-test-app';
import { FaultInjectingClaimLedger } from './fault-injecting.claim-ledger';
import { FaultInjectingPayloadStore } from './fault-injecting.payload-store';

const LEASE_MS = 300;
const READ_TIMEOUT_MS = 100;

/**
 * Claim Check: the calls a ticket's delivery waits on besides the read — the claim ledger's
 * `claim`, `complete` and `release`, the payload store's `markPublished` and the `delete` before
 * the ack — must not hold the message, and its prefetch slot, for ever when they never answer.
 * A ledger call is given up on after `tuning.leaseMs` (`complete` after half of it, as its
 * retries are); a store call after `claimCheck.readTimeoutMs`.
 */
describe('claim check: a ledger or store call that never answers', () => {
  const payload = bytes(20_000, 5);
  let t: ClaimCheckTestApp | undefined;
  let ledger: FaultInjectingClaimLedger;
  let store: FaultInjectingPayloadStore;
  let ticket: ClaimTicket;

  async function boot(options: Partial<ClaimCheckTestAppOptions> = {}): Promise<ClaimCheckTestApp> {
    ledger = new FaultInjectingClaimLedger();
    t = await createClaimCheckTestApp({
      ...options,
      module: { ...options.module, tuning: { leaseMs: LEASE_MS, ...options.module?.tuning } },
      claimCheck: {
        ledger,
        readTimeoutMs: READ_TIMEOUT_MS,
        inlineMaxBytes: 1024,
        ...options.claimCheck,
      },
      wrapStore: (inner) => (store = new FaultInjectingPayloadStore(inner)),
    });
    ticket = await t.claimCheck.checkIn(payload, { audience: t.channel });
    return t;
  }
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  /** Whether every message of the app was settled within `ms` (a hung call never settles). */
  async function settledWithin(app: ClaimCheckTestApp, ms = 4_000): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
    const settled = await Promise.race([app.transport.whenIdle().then(() => true as const), late]);
    clearTimeout(timer);
    return settled;
  }

  it('a claim that never answers: requeued after leaseMs, then handled once', async () => {
    const app = await boot();
    ledger.hangClaims = 1;
    await publishTicket(app.transport, app.channel, ticket);

    expect(await settledWithin(app)).toBe(true);
    expect(app.transport.actionsOn(app.channel)).toEqual(['requeue', 'ack']);
    expect(app.handler.calls).toBe(1);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });

  it('a claim taken in the ledger whose reply never comes (nor its release): the redelivery is handled exactly once', async () => {
    const app = await boot();
    ledger.hangClaimsAfterRecording = 1;
    ledger.hangReleases = 1;
    await publishTicket(app.transport, app.channel, ticket);

    expect(await settledWithin(app)).toBe(true);
    // The lost claim was taken; given up on after leaseMs, its lease had lapsed, and the
    // redelivery took it over at once: never 'busy', never two handlers.
    expect(ledger.claimOutcomes).toEqual(['claimed', 'claimed']);
    expect(app.transport.actionsOn(app.channel)).toEqual(['requeue', 'ack']);
    expect(app.handler.calls).toBe(1);
    // A copy after that is a duplicate.
    await publishTicket(app.transport, app.channel, ticket);
    expect(await settledWithin(app)).toBe(true);
    expect(app.handler.calls).toBe(1);
    expect(app.transport.actionsOn(app.channel)).toEqual(['requeue', 'ack', 'ack']);
  });

  it('renewals that never answer: the handler is aborted before its lease could lapse, never runs twice at once, and the ticket is handled once', async () => {
    const app = await boot();
    let running = 0;
    let maxRunning = 0;
    const aborted: unknown[] = [];
    app.handler.onCall = async (_payload, { signal }) => {
      running++;
      maxRunning = Math.max(maxRunning, running);
      try {
        // Works for four leases, unless told to stop.
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, 4 * LEASE_MS);
          signal.addEventListener('abort', () => {
            clearTimeout(timer);
            aborted.push(signal.reason);
            resolve();
          });
        });
        if (signal.aborted) throw signal.reason;
      } finally {
        running--;
      }
    };
    // The first holder's first two renewals never answer: its lease lapses unless it stops.
    ledger.hangRenewals = 2;
    // Two copies of the ticket at once (a redelivery, a second publish): the copy finds the
    // ticket busy and comes back until it can claim it.
    await publishTicket(app.transport, app.channel, ticket);
    await publishTicket(app.transport, app.channel, ticket);

    expect(await settledWithin(app)).toBe(true);
    expect(maxRunning).toBe(1);
    expect(aborted).toEqual([expect.any(ClaimLeaseLostError)]);
    expect(app.handler.deliveries).toHaveLength(1);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    const actions = app.transport.actionsOn(app.channel);
    expect(actions).not.toContain('dead-letter');
    expect(actions.filter((action) => action === 'ack')).toHaveLength(2);
  });

  it('a renewal that finds the claim taken: the handler is aborted at once, nothing recorded, and the ticket handled once later', async () => {
    const app = await boot();
    const aborted: unknown[] = [];
    let intruded = false;
    app.handler.onCall = async (_payload, { signal }) => {
      if (intruded) return;
      intruded = true;
      // Another holder takes the claim over (as after a lapse on the ledger's clock).
      const key = { ticket: `filesystem:${ticket.ref}`, group: app.channel };
      expect(await ledger.claim(key, 'intruder', LEASE_MS, Date.now() + LEASE_MS)).toBe('claimed');
      await new Promise<void>((resolve) =>
        signal.addEventListener('abort', () => {
          aborted.push(signal.reason);
          resolve();
        }),
      );
      throw signal.reason;
    };
    await publishTicket(app.transport, app.channel, ticket);

    expect(await settledWithin(app)).toBe(true);
    expect(aborted).toEqual([expect.objectContaining({ code: 'claim-lease-lost', why: 'taken' })]);
    expect(aborted[0]).toBeInstanceOf(ClaimLeaseLostError);
    expect(ledger.calls.complete).toBe(1); // the redelivery's only
    const actions = app.transport.actionsOn(app.channel);
    expect(actions[0]).toBe('requeue');
    expect(actions.at(-1)).toBe('ack');
    expect(actions).not.toContain('dead-letter');
    expect(app.handler.deliveries).toHaveLength(1);
  });

  it('a ledger that never answers: dead-lettered store-unavailable after maxStoreRequeues, naming the call and the timeout', async () => {
    const app = await boot({ module: { tuning: { maxStoreRequeues: 2 } } });
    ledger.hangClaims = 1_000;
    await publishTicket(app.transport, app.channel, ticket);

    expect(await settledWithin(app)).toBe(true);
    expect(app.transport.actionsOn(app.channel)).toEqual(['requeue', 'requeue', 'dead-letter']);
    expect(deathReasons(app.transport, app.channel)).toEqual([
      expect.stringMatching(
        new RegExp(
          '^store-unavailable: claim ledger unavailable after 2 requeues of the message .*' +
            `last: the memory claim ledger did not answer claim of "filesystem:${ticket.ref}" ` +
            `for cc\\.test within ${LEASE_MS} ms \\(tuning\\.leaseMs\\)`,
        ),
      ),
    ]);
    expect(app.handler.calls).toBe(0);
    expect(await app.store.head(ticket.ref)).toBeDefined();
  });

  it('a completion recorded whose reply never comes: requeued, and the redelivery acked as a duplicate', async () => {
    const app = await boot();
    ledger.hangCompletesAfterRecording = 1;
    await publishTicket(app.transport, app.channel, ticket);

    expect(await settledWithin(app)).toBe(true);
    expect(app.transport.actionsOn(app.channel)).toEqual(['requeue', 'ack']);
    expect(app.handler.calls).toBe(1);
    // The duplicate applied the retention the lost reply skipped.
    expect(await app.store.head(ticket.ref)).toBeUndefined();
  });

  it('a completion that never answers nor lands: requeued, then handled again (at least once)', async () => {
    const app = await boot();
    ledger.hangCompletes = 1;
    await publishTicket(app.transport, app.channel, ticket);

    expect(await settledWithin(app)).toBe(true);
    const actions = app.transport.actionsOn(app.channel);
    expect(actions[0]).toBe('requeue');
    expect(actions.at(-1)).toBe('ack');
    expect(actions).not.toContain('dead-letter');
    expect(app.handler.calls).toBe(2);
  });

  it('a release that never answers after the handler failed: dead-lettered handler-failed all the same', async () => {
    const app = await boot();
    ledger.hangReleases = 1;
    app.handler.failNext = 3;
    await publishTicket(app.transport, app.channel, ticket);

    expect(await settledWithin(app)).toBe(true);
    expect(app.transport.actionsOn(app.channel)).toEqual(['dead-letter']);
    expect(deathReasons(app.transport, app.channel)[0]).toMatch(/^handler-failed: /);
  });

  it('a delete before the ack that never answers: acked after readTimeoutMs, the payload left to the sweeper', async () => {
    const app = await boot();
    store.hangDeletes = 1;
    await publishTicket(app.transport, app.channel, ticket);

    expect(await settledWithin(app)).toBe(true);
    expect(app.transport.actionsOn(app.channel)).toEqual(['ack']);
    expect(app.handler.calls).toBe(1);
    expect(await app.store.head(ticket.ref)).toBeDefined();
  });

  it('a mark of an unpublished payload that never answers: handled and acked all the same', async () => {
    const app = await boot();
    store.hangMarks = 1;
    const now = Date.now();
    const expiresAt = now + 3_600_000;
    const { ref } = await app.store.put(payload, { now, expiresAt, published: false });
    const unmarked = signedByApp(app, {
      store: app.store.name,
      ref,
      bytes: payload.length,
      sha256: createHash('sha256').update(payload).digest('hex'),
      expiresAt,
      audience: [app.channel],
    });
    await publishTicket(app.transport, app.channel, unmarked);

    expect(await settledWithin(app)).toBe(true);
    expect(app.transport.actionsOn(app.channel)).toEqual(['ack']);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });
});

/**
 * The same against a real ledger: a RedisClaimLedger whose connection to the real Redis goes
 * through a proxy that, once the ledger is warm, lets requests through but no reply back. The
 * claim is taken in Redis and its reply never comes (ioredis has no command timeout of its own).
 */
describeWithServer('redis', 'claim check: a Redis claim ledger whose claim reply is lost', () => {
  const redis = useRedis({ stem: 'nseq-test-lost-claim' });
  let proxy: FreezingProxy | undefined;
  let client: Redis | undefined;
  let t: ClaimCheckTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    client?.disconnect();
    await proxy?.close();
    t = client = proxy = undefined;
  });

  it('the claim landed: given up on after leaseMs, and the redelivery is handled exactly once', async () => {
    const leaseMs = 1_000;
    ({ proxy, client } = await redisThroughProxy(redis.client.options.port!));
    const ledger = new RedisClaimLedger(client, { prefix: redis.prefix });
    // Warm: the claim script is loaded on the server before replies are lost.
    await ledger.claim({ ticket: 'warm:up', group: 'warm' }, 'warm', leaseMs, Date.now());
    const app = (t = await createClaimCheckTestApp({
      module: { tuning: { leaseMs } },
      claimCheck: { ledger, inlineMaxBytes: 1024 },
    }));
    const payload = bytes(20_000, 9);
    const ticket = await app.claimCheck.checkIn(payload, { audience: app.channel });

    proxy.freezeReplies();
    const startedAt = Date.now();
    await publishTicket(app.transport, app.channel, ticket);
    // The claim reaches Redis and takes the lease; its reply never comes back.
    const leaseKeys = () => redis.client.keys(`${redis.prefix}:*:lease:${app.channel}`);
    await eventually(async () => (await leaseKeys()).length === 1, 'the claim taken', 5_000);
    expect(app.transport.actionsOn(app.channel)).toEqual([]);
    await eventually(
      () => app.transport.actionsOn(app.channel).includes('requeue'),
      'the claim given up on',
      5_000,
    );
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(leaseMs);
    proxy.resume(); // the link is reset; ioredis reconnects and sends what it had in flight again

    await eventually(() => app.handler.calls > 0, 'the redelivery handled', 5_000);
    await app.transport.whenIdle();
    expect(app.transport.actionsOn(app.channel)).toEqual(['requeue', 'ack']);
    expect(app.handler.calls).toBe(1);
    expect(app.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });
});
