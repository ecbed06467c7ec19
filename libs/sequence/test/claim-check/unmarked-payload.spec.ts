import { createHash } from 'node:crypto';
import { type ClaimTicket } from 'nest-sequence/wire';
import { bytes } from '../support/sequence-test-app';
import {
  createClaimCheckTestApp,
  deathReasons,
  publishTicket,
  signedByApp,
  type ClaimCheckTestApp,
} from './claim-check-test-app';
import { FaultInjectingPayloadStore } from './fault-injecting.payload-store';

const HOUR = 3_600_000;

/**
 * Claim Check: a payload whose ticket was delivered but which its sender never marked published
 * (it died between the broker's confirm and the mark, or the store failed for longer than it kept
 * trying). Its ticket is out, so it is no orphan: the sweeper must not take it while it is still
 * wanted.
 */
describe('claim check: a delivered payload its sender left unpublished', () => {
  let t: ClaimCheckTestApp;
  afterEach(() => t.close());

  /** What `publish()` leaves when its process dies right after the broker's confirm. */
  async function publishedButUnmarked(
    audience: string[],
    payload: Buffer,
    channel: string = audience[0],
    /** The bytes the ticket names (other than `payload`: an integrity mismatch). */
    named: Buffer = payload,
  ): Promise<ClaimTicket> {
    const now = Date.now();
    const expiresAt = now + 24 * HOUR;
    const { ref } = await t.store.put(payload, { now, expiresAt, published: false });
    const ticket = signedByApp(t, {
      store: t.store.name,
      ref,
      bytes: payload.length,
      sha256: createHash('sha256').update(named).digest('hex'),
      expiresAt,
      audience,
    });
    await publishTicket(t.transport, channel, ticket);
    return ticket;
  }

  it('is kept for its dead letter to be republished when its handler kept failing', async () => {
    t = await createClaimCheckTestApp();
    const payload = bytes(4_000, 1);
    t.handler.failNext = 3;
    const ticket = await publishedButUnmarked([t.channel], payload);
    await t.transport.whenIdle();
    expect(deathReasons(t.transport, t.channel)[0]).toMatch(/^handler-failed: /);

    const later = Date.now() + t.options.claimCheck.orphanGraceMs + 60_000;
    expect(await t.sweeper.sweep(later)).toEqual({ expired: 0, orphaned: 0 });

    // Fixed, the dead letter is published again.
    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();
    expect(t.handler.deliveries).toHaveLength(1);
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });

  it('is kept for its dead letter to be republished when its bytes are refused, though the mark before its handler failed', async () => {
    let store!: FaultInjectingPayloadStore;
    t = await createClaimCheckTestApp({
      wrapStore: (inner) => (store = new FaultInjectingPayloadStore(inner)),
    });
    store.failMarks = 1;
    const payload = bytes(4_000, 5);
    await publishedButUnmarked([t.channel], payload, t.channel, bytes(4_000, 6));
    await t.transport.whenIdle();
    expect(deathReasons(t.transport, t.channel)[0]).toMatch(/^integrity-mismatch: /);

    // Refused bytes may be bytes this side cannot decrypt yet: kept until expiry, not swept.
    const later = Date.now() + t.options.claimCheck.orphanGraceMs + 60_000;
    expect(await t.sweeper.sweep(later)).toEqual({ expired: 0, orphaned: 0 });
  });

  it('is not swept while its handler runs', async () => {
    t = await createClaimCheckTestApp();
    const payload = bytes(4_000, 3);
    const later = Date.now() + t.options.claimCheck.orphanGraceMs + 60_000;
    const swept: unknown[] = [];
    t.handler.onCall = async () => {
      swept.push(await t.sweeper.sweep(later));
    };
    await publishedButUnmarked([t.channel], payload);
    await t.transport.whenIdle();

    expect(swept).toEqual([{ expired: 0, orphaned: 0 }]);
    expect(deathReasons(t.transport, t.channel)).toEqual([]);
    expect(t.handler.deliveries).toHaveLength(1);
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
  });

  it('is kept for the other channels of its audience after one handled it', async () => {
    t = await createClaimCheckTestApp({
      handlers: [
        { channel: 'cc.billing', deleteAfter: { consumers: 2 } },
        { channel: 'cc.archive', deleteAfter: { consumers: 2 } },
      ],
    });
    const payload = bytes(4_000, 2);
    const ticket = await publishedButUnmarked(['cc.billing', 'cc.archive'], payload);
    await t.transport.whenIdle();
    expect(t.handlerOn('cc.billing').deliveries).toHaveLength(1);

    // The archive lags behind by more than orphanGraceMs.
    const later = Date.now() + t.options.claimCheck.orphanGraceMs + 60_000;
    expect(await t.sweeper.sweep(later)).toEqual({ expired: 0, orphaned: 0 });
    await publishTicket(t.transport, 'cc.archive', ticket);
    await t.transport.whenIdle();

    expect(deathReasons(t.transport, 'cc.archive')).toEqual([]);
    expect(t.handlerOn('cc.archive').deliveries).toHaveLength(1);
    expect(t.handlerOn('cc.archive').deliveries[0].bytes.equals(payload)).toBe(true);
  });
});
