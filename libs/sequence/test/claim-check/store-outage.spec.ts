import type { ClaimTicket } from 'nest-sequence/wire';
import { bytes } from '../support/sequence-test-app';
import {
  createClaimCheckTestApp,
  deathReasons,
  publishTicket,
  type ClaimCheckTestApp,
} from './claim-check-test-app';
import { FaultInjectingPayloadStore } from './fault-injecting.payload-store';

/**
 * Claim Check: an unreachable payload store is not a verdict on the message. While `head` or
 * `get` fail with a plain error, the ticket is requeued with a delay; once the store answers, it
 * is delivered, once. Not forever: once it has been requeued `maxStoreRequeues` times it is
 * dead-lettered `store-unavailable` (an error that is no outage would otherwise loop until the
 * ticket expires).
 */
describe('claim check: payload store outage', () => {
  const BACKPRESSURE_DELAY_MS = 10;
  const payload = bytes(6_000, 1);
  let t: ClaimCheckTestApp;
  let store: FaultInjectingPayloadStore;
  let ticket: ClaimTicket;
  beforeEach(async () => {
    t = await createClaimCheckTestApp({
      module: {
        tuning: { backpressureDelayMs: BACKPRESSURE_DELAY_MS },
      },
      wrapStore: (inner) => (store = new FaultInjectingPayloadStore(inner)),
    });
    ticket = await t.claimCheck.checkIn(payload, { audience: t.channel });
  });
  afterEach(() => t.close());

  const requeue = { action: 'requeue', delayMs: BACKPRESSURE_DELAY_MS };

  it('head failing 10 times: requeued with a delay each time, then delivered once', async () => {
    store.failReads = 10;
    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();

    const settlements = t.transport.settlements.map((s) => s.disposition);
    expect(settlements).toHaveLength(11);
    for (const disposition of settlements.slice(0, 10)) expect(disposition).toMatchObject(requeue);
    expect(settlements[10]).toEqual({ action: 'ack' });
    expect(t.handler.calls).toBe(1);
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    expect(deathReasons(t.transport, t.channel)).toEqual([]);
    expect(store.calls.head).toBe(11);
  });

  it('get failing twice: the handler’s read fails, the ticket is requeued, then delivered', async () => {
    store.failGets = 2;
    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();

    expect(t.transport.actionsOn(t.channel)).toEqual(['requeue', 'requeue', 'ack']);
    // One call per delivery: a read failure is not the handler's fault, so no handler retry.
    expect(t.handler.calls).toBe(3);
    expect(t.handler.readErrors).toHaveLength(2);
    expect(t.handler.deliveries).toHaveLength(1);
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    expect(deathReasons(t.transport, t.channel)).toEqual([]);
  });

  /**
   * A handler that catches its read error and returns did not get the bytes: it is not a success
   * (no ack, no completion, no deletion), and the outage requeues the ticket.
   */
  it('a handler that swallows the read error: requeued, not acked as done', async () => {
    store.failGets = 1;
    t.handler.read = async (claimed) => {
      try {
        return await claimed.toBuffer();
      } catch {
        return Buffer.alloc(0); // a careless handler: "could not read, never mind"
      }
    };
    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();

    expect(t.transport.actionsOn(t.channel)).toEqual(['requeue', 'ack']);
    expect(t.handler.deliveries.map((d) => d.bytes.equals(payload))).toEqual([false, true]);
  });

  it('a handler that reads again after a failed read, then fails itself: retried, not requeued', async () => {
    store.failGets = 1;
    let ownFailures = 1;
    t.handler.read = async (claimed) => {
      const read = await claimed.toBuffer().catch(() => claimed.toBuffer()); // its own retry
      if (ownFailures-- > 0) throw new Error('the handler’s own failure (expected by the test)');
      return read;
    };
    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();

    // The outage was over once the second read succeeded: the failure was the handler's own.
    expect(t.transport.actionsOn(t.channel)).toEqual(['ack']);
    expect(t.handler.calls).toBe(2);
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });

  it('checkOut by hand: readFailure tells of a failed read until a later read succeeds', async () => {
    store.failGets = 1;
    const claimed = await t.claimCheck.checkOut(ticket);
    await expect(claimed.toBuffer()).rejects.toThrow(/unreachable/);
    expect(claimed.readFailure?.message).toMatch(/unreachable/);
    expect((await claimed.toBuffer()).equals(payload)).toBe(true);
    expect(claimed.readFailure).toBeUndefined();
  });

  it('the payload is kept through the outage and deleted after the one successful delivery', async () => {
    store.failReads = Number.MAX_SAFE_INTEGER;
    await publishTicket(t.transport, t.channel, ticket);
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(store.calls.head).toBeGreaterThan(1);
    expect(await t.store.head(ticket.ref)).toBeDefined();

    store.failReads = 0;
    await t.transport.whenIdle();
    expect(t.handler.deliveries).toHaveLength(1);
    expect(await t.store.head(ticket.ref)).toBeUndefined();
  });

  it('inline messages behind the ticket are delivered during the outage', async () => {
    store.failReads = Number.MAX_SAFE_INTEGER;
    await publishTicket(t.transport, t.channel, ticket);
    await t.claimCheck.publish(t.channel, Buffer.from('inline, needs no store'));
    await new Promise((resolve) => setTimeout(resolve, 100));

    expect(t.handler.deliveries.map((d) => d.payload.via)).toEqual(['inline']);
    expect(deathReasons(t.transport, t.channel)).toEqual([]);

    store.failReads = 0;
    await t.transport.whenIdle();
    expect(t.handler.deliveries.map((d) => d.payload.via)).toEqual(['inline', 'ticket']);
  });

  it('a store that keeps failing: dead-lettered store-unavailable after maxStoreRequeues requeues, payload kept', async () => {
    await t.close();
    t = await createClaimCheckTestApp({
      module: {
        tuning: { backpressureDelayMs: BACKPRESSURE_DELAY_MS, maxStoreRequeues: 3 },
      },
      wrapStore: (inner) => (store = new FaultInjectingPayloadStore(inner)),
    });
    ticket = await t.claimCheck.checkIn(payload, { audience: t.channel });
    store.failReads = 1_000;

    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();

    const settlements = t.transport.settlements.map((s) => s.disposition);
    expect(settlements).toHaveLength(4);
    for (const disposition of settlements.slice(0, 3)) expect(disposition).toMatchObject(requeue);
    expect(deathReasons(t.transport, t.channel)).toEqual([
      expect.stringMatching(
        /^store-unavailable: payload store unavailable after 3 requeues of the message/,
      ),
    ]);
    expect(t.handler.calls).toBe(0);
    store.failReads = 0;
    expect(await t.store.head(ticket.ref)).toBeDefined();
  });
});
