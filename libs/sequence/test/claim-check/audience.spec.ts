import { MemoryClaimLedger, SequenceOptionsError, SplitterService } from 'nest-sequence';
import type { ClaimKey, ClaimLedger, ClaimOutcome, Completion } from 'nest-sequence/ports';
import { serializeTicket, ticketSigningInput, type ClaimTicket } from '../../src/core/claim-ticket';
import { ClaimCheckFragmentParking } from '../../src/claim-check/fragment-parking';
import { bytes } from '../support/sequence-test-app';
import { FaultInjectingPayloadStore } from './fault-injecting.payload-store';
import type { HeaderMap } from 'nest-sequence/wire';
import {
  claimMetric,
  createClaimCheckTestApp,
  deathReasons,
  filesUnder,
  publishTicket,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/** A real memory ledger that counts the calls made to it: a refused ticket must make none. */
class CountingClaimLedger implements ClaimLedger {
  readonly name = 'memory';
  readonly calls = { claim: 0, complete: 0, release: 0 };
  private readonly inner = new MemoryClaimLedger();

  claim(key: ClaimKey, holder: string, leaseMs: number, now: number): Promise<ClaimOutcome> {
    this.calls.claim++;
    return this.inner.claim(key, holder, leaseMs, now);
  }

  complete(key: ClaimKey, holder: string, retainUntil: number, now: number): Promise<Completion> {
    this.calls.complete++;
    return this.inner.complete(key, holder, retainUntil, now);
  }

  release(key: ClaimKey, holder: string): Promise<void> {
    this.calls.release++;
    return this.inner.release(key, holder);
  }

  ping(): Promise<void> {
    return this.inner.ping();
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}

const ORDERS = 'cc.orders';
const AUDIT = 'cc.audit';
/** A channel nobody consumes: what is published there stays queued. */
const UNCONSUMED = 'cc.unconsumed';

/**
 * Claim Check: a ticket is signed for the channels it was issued for (its audience), and a
 * consumer takes it only on one of them. A ticket replayed onto another channel is dead-lettered
 * `wrong-audience` before the claim ledger or the payload store is touched; tickets that name no
 * channel (earlier releases) are taken only while `claimCheck.acceptTicketsWithoutAudience` is on.
 */
describe('claim check: tickets bound to their channel', () => {
  let t: ClaimCheckTestApp;
  let ledger: CountingClaimLedger;
  let store: FaultInjectingPayloadStore;

  async function start(
    acceptTicketsWithoutAudience?: boolean,
    deleteAfter?: { consumers: number },
  ): Promise<void> {
    ledger = new CountingClaimLedger();
    t = await createClaimCheckTestApp({
      handlers: [
        { channel: AUDIT, deleteAfter },
        { channel: ORDERS, deleteAfter },
      ],
      claimCheck: { ledger, acceptTicketsWithoutAudience },
      wrapStore: (inner) => (store = new FaultInjectingPayloadStore(inner)),
      module: { handlerRetry: { attempts: 1 } },
    });
  }
  afterEach(() => t.close());

  /** A ticket as releases before audiences wrote it (`v: 1`), signed with the app's key. */
  function legacyTicket(genuine: ClaimTicket): Record<string, unknown> {
    const { audience: _audience, sig: _sig, ...fields } = genuine;
    const unsigned = { ...fields, v: 1 as const };
    const keyring = t.options.claimCheck.keyring;
    const sig = keyring.hmac(unsigned.kid, ticketSigningInput(unsigned))!.toString('base64url');
    return { ...unsigned, sig };
  }

  function expectUntouched(): void {
    expect(ledger.calls).toEqual({ claim: 0, complete: 0, release: 0 });
    expect(store.calls).toEqual({ head: 0, get: 0, delete: 0 });
  }

  describe('a ticket published onto a channel it was not issued for', () => {
    beforeEach(() => start());

    it('is dead-lettered wrong-audience without touching the ledger or the store, and its payload is kept', async () => {
      const payload = bytes(4 * t.options.claimCheck.inlineMaxBytes, 1);
      const receipt = await t.claimCheck.publish(UNCONSUMED, payload);
      expect(receipt.via).toBe('ticket');
      const replayed = serializeTicket(receipt.ticket!);

      await publishTicket(t.transport, AUDIT, replayed, { 'x-origin': 'replay' });
      await t.transport.whenIdle();

      expect(t.handlerOn(AUDIT).calls).toBe(0);
      const reasons = deathReasons(t.transport, AUDIT);
      expect(reasons).toHaveLength(1);
      expect(reasons[0]).toMatch(
        new RegExp(
          `^wrong-audience: claim ticket filesystem:\\S+ was issued for "${UNCONSUMED}", not for "${AUDIT}"`,
        ),
      );
      const [dead] = t.transport.peek(`${AUDIT}.dlq`);
      expect(dead.body.equals(replayed)).toBe(true);
      expect(dead.headers).toMatchObject({ 'x-claim-check': 1, 'x-origin': 'replay' });
      expect(t.transport.actionsOn(AUDIT)).toEqual(['dead-letter']);
      expect(
        await claimMetric(t, 'rejected_total', { channel: AUDIT, reason: 'wrong-audience' }),
      ).toBe(1);
      expectUntouched();
      expect(await t.store.head(receipt.ticket!.ref)).toMatchObject({ bytes: payload.length });
      // The ticket still waits, valid, on the channel it was issued for.
      expect(t.transport.depth(UNCONSUMED)).toBe(1);
    });

    it('is still handled on its own channel afterwards', async () => {
      const payload = bytes(3_000, 2);
      const ticket = await t.claimCheck.checkIn(payload, { audience: ORDERS });

      await publishTicket(t.transport, AUDIT, ticket);
      await publishTicket(t.transport, ORDERS, ticket);
      await t.transport.whenIdle();

      expect(deathReasons(t.transport, AUDIT)[0]).toMatch(/^wrong-audience: /);
      expect(t.handlerOn(AUDIT).calls).toBe(0);
      expect(t.handlerOn(ORDERS).deliveries.map((d) => d.bytes.equals(payload))).toEqual([true]);
      expect(deathReasons(t.transport, ORDERS)).toEqual([]);
    });

    it('a parked fragment replayed onto another channel is dead-lettered wrong-audience too', async () => {
      const payload = bytes(200 * 1024, 3);
      await t.app
        .get(SplitterService)
        .send(UNCONSUMED, payload, { via: 'claim-check', fragmentBytes: 64 * 1024 });
      const fragments = t.transport.peek(UNCONSUMED);
      expect(fragments).toHaveLength(4);

      for (const fragment of fragments) {
        await t.transport.publish(AUDIT, fragment.body, fragment.headers as HeaderMap);
      }
      await t.transport.whenIdle();

      expect(t.handlerOn(AUDIT).calls).toBe(0);
      const reasons = deathReasons(t.transport, AUDIT);
      expect(reasons).toHaveLength(4);
      expect(reasons.every((reason) => reason.startsWith('wrong-audience: '))).toBe(true);
      expect(store.calls).toEqual({ head: 0, get: 0, delete: 0 });
    });

    it("a parked fragment's ticket replayed alone on its own channel does not pass for a payload's", async () => {
      const parked = await t.app
        .get(ClaimCheckFragmentParking)
        .park(bytes(64 * 1024, 5), ORDERS, { sequenceId: 'parked', position: 1 });

      await publishTicket(t.transport, ORDERS, parked.ticketBody);
      await t.transport.whenIdle();

      expect(t.handlerOn(ORDERS).calls).toBe(0);
      expect(deathReasons(t.transport, ORDERS)).toEqual([
        expect.stringMatching(
          `^wrong-audience: claim ticket filesystem:\\S+ was issued for "fragment of ${ORDERS}"`,
        ),
      ]);
      expectUntouched();
    });

    it("a payload's ticket carried as a fragment does not pass for a fragment's", async () => {
      const ticket = await t.claimCheck.checkIn(bytes(3_000, 6), { audience: ORDERS });
      await t.app
        .get(SplitterService)
        .send(UNCONSUMED, bytes(100, 7), { via: 'claim-check', fragmentBytes: 64 * 1024 });
      const [fragment] = t.transport.peek(UNCONSUMED);

      await t.transport.publish(ORDERS, serializeTicket(ticket), fragment.headers as HeaderMap);
      await t.transport.whenIdle();

      expect(t.handlerOn(ORDERS).calls).toBe(0);
      expect(deathReasons(t.transport, ORDERS)).toEqual([
        expect.stringMatching(
          `^wrong-audience: .* was issued for "${ORDERS}", not for "fragment of`,
        ),
      ]);
      expectUntouched();
    });

    it('a ticket checked in without an audience is taken on no channel, but checkOut reads it', async () => {
      const payload = bytes(3_000, 4);
      const ticket = await t.claimCheck.checkIn(payload);
      expect(ticket.audience).toEqual([]);

      await publishTicket(t.transport, ORDERS, ticket);
      await t.transport.whenIdle();

      expect(t.handlerOn(ORDERS).calls).toBe(0);
      expect(deathReasons(t.transport, ORDERS)[0]).toMatch(
        /^wrong-audience: .* issued for no channel/,
      );
      expectUntouched();
      expect((await (await t.claimCheck.checkOut(ticket)).toBuffer()).equals(payload)).toBe(true);
    });

    it('fan-out: a ticket issued for two channels is handled on each', async () => {
      await t.close();
      await start(undefined, { consumers: 2 });
      const payload = bytes(3_000, 5);
      const ticket = await t.claimCheck.checkIn(payload, { audience: [ORDERS, AUDIT] });

      await publishTicket(t.transport, ORDERS, ticket);
      await publishTicket(t.transport, AUDIT, ticket);
      await t.transport.whenIdle();

      expect(t.handlerOn(ORDERS).deliveries.map((d) => d.bytes.equals(payload))).toEqual([true]);
      expect(t.handlerOn(AUDIT).deliveries.map((d) => d.bytes.equals(payload))).toEqual([true]);
      expect(deathReasons(t.transport, ORDERS)).toEqual([]);
      expect(deathReasons(t.transport, AUDIT)).toEqual([]);
      expect(await t.store.head(ticket.ref)).toBeUndefined();
    });
  });

  describe('tampering with the audience', () => {
    beforeEach(() => start());

    it.each([
      ['rewritten to the other channel', [AUDIT]],
      ['with the other channel added', [ORDERS, AUDIT]],
    ])('%s: bad-signature, the payload untouched', async (_case, audience) => {
      const ticket = await t.claimCheck.checkIn(bytes(3_000, 6), { audience: ORDERS });

      await publishTicket(t.transport, AUDIT, { ...ticket, audience });
      await t.transport.whenIdle();

      expect(t.handlerOn(AUDIT).calls).toBe(0);
      expect(deathReasons(t.transport, AUDIT)[0]).toMatch(
        /^claim-ticket-invalid: claim ticket refused \(bad-signature\)/,
      );
      expectUntouched();
      expect(await t.store.head(ticket.ref)).toBeDefined();
    });

    it('stripped of its audience and relabelled v 1: bad-signature, even with tickets without audience accepted', async () => {
      await t.close();
      await start(true);
      const ticket = await t.claimCheck.checkIn(bytes(3_000, 7), { audience: ORDERS });
      const { audience: _audience, ...stripped } = ticket;

      await publishTicket(t.transport, AUDIT, { ...stripped, v: 1 });
      await t.transport.whenIdle();

      expect(t.handlerOn(AUDIT).calls).toBe(0);
      expect(deathReasons(t.transport, AUDIT)[0]).toMatch(/\(bad-signature\)/);
      expectUntouched();
    });
  });

  describe('tickets without an audience (v 1, from earlier releases)', () => {
    it('are dead-lettered claim-ticket-invalid (no-audience) by default, untouched', async () => {
      await start();
      expect(t.options.claimCheck.acceptTicketsWithoutAudience).toBe(false);
      const ticket = await t.claimCheck.checkIn(bytes(3_000, 8), { audience: ORDERS });

      await publishTicket(t.transport, ORDERS, legacyTicket(ticket));
      await t.transport.whenIdle();

      expect(t.handlerOn(ORDERS).calls).toBe(0);
      expect(deathReasons(t.transport, ORDERS)[0]).toMatch(
        /^claim-ticket-invalid: claim ticket refused \(no-audience\): .*acceptTicketsWithoutAudience/,
      );
      expectUntouched();
      expect(await t.store.head(ticket.ref)).toBeDefined();
    });

    it('are handled on any channel while claimCheck.acceptTicketsWithoutAudience is on', async () => {
      await start(true);
      const payload = bytes(3_000, 9);
      const ticket = await t.claimCheck.checkIn(payload, { audience: ORDERS });

      await publishTicket(t.transport, AUDIT, legacyTicket(ticket));
      await t.transport.whenIdle();

      expect(t.handlerOn(AUDIT).deliveries.map((d) => d.bytes.equals(payload))).toEqual([true]);
      expect(t.handlerOn(AUDIT).deliveries[0].payload.ticket).toMatchObject({ v: 1 });
      expect(deathReasons(t.transport, AUDIT)).toEqual([]);
    });

    it('still bind tickets that have an audience while the option is on', async () => {
      await start(true);
      const ticket = await t.claimCheck.checkIn(bytes(3_000, 10), { audience: ORDERS });

      await publishTicket(t.transport, AUDIT, ticket);
      await t.transport.whenIdle();

      expect(deathReasons(t.transport, AUDIT)[0]).toMatch(/^wrong-audience: /);
      expectUntouched();
    });

    it('checkOut reads them whatever the option (it consumes no channel)', async () => {
      await start();
      const payload = bytes(3_000, 11);
      const ticket = await t.claimCheck.checkIn(payload, { audience: ORDERS });

      const claimed = await t.claimCheck.checkOut(legacyTicket(ticket));

      expect((await claimed.toBuffer()).equals(payload)).toBe(true);
    });
  });

  describe('options', () => {
    it('refuses an acceptTicketsWithoutAudience that is not a boolean, at boot', async () => {
      await expect(
        createClaimCheckTestApp({
          claimCheck: { acceptTicketsWithoutAudience: 'yes' as unknown as boolean },
        }),
      ).rejects.toThrow(/claimCheck\.acceptTicketsWithoutAudience must be true or false/);
      await start(); // for afterEach
    });

    it.each([
      ['an empty channel name', ''],
      ['a channel named twice', [ORDERS, ORDERS]],
      ['a channel name over 255 characters', 'c'.repeat(256)],
      ["a channel named as another's fragments", ['cc.audit', `fragment of ${ORDERS}`]],
      [
        'more channels than a ticket holds',
        Array.from({ length: 40 }, (_, i) => `${i}.${'c'.repeat(240)}`),
      ],
    ])('checkIn refuses an audience with %s before storing anything', async (_case, audience) => {
      await start();
      const put = jest.spyOn(t.store, 'put');

      await expect(t.claimCheck.checkIn(bytes(10, 12), { audience })).rejects.toBeInstanceOf(
        SequenceOptionsError,
      );
      expect(put).not.toHaveBeenCalled();
      expect(await filesUnder(t.root)).toEqual([]);
    });

    // The audience of a channel's fragment tickets is "fragment of <channel>": a channel named so
    // would take ORDERS' fragment tickets as whole payloads, and its tickets would pass for them.
    const RESERVED = `fragment of ${ORDERS}`;

    it('refuses a @ClaimCheck channel named as fragments of another, at boot', async () => {
      await expect(createClaimCheckTestApp({ handlers: [{ channel: RESERVED }] })).rejects.toThrow(
        new RegExp(
          `@ClaimCheck on Handler.handle:[\\s\\S]*channel "${RESERVED}" starts with "fragment of ", which claim ` +
            `tickets keep for the fragments of channel "${ORDERS}"`,
        ),
      );
      await start(); // for afterEach
    });

    it('refuses publish() to a channel named as fragments of another, before reading anything', async () => {
      await start();
      const put = jest.spyOn(t.store, 'put');

      await expect(t.claimCheck.publish(RESERVED, bytes(100_000, 3))).rejects.toThrow(
        SequenceOptionsError,
      );
      await expect(t.claimCheck.publish(RESERVED, bytes(10, 3))).rejects.toThrow(
        /publish\(\) to fragment of cc\.orders:[\s\S]*starts with "fragment of "/,
      );
      expect(put).not.toHaveBeenCalled();
      expect(t.transport.peek(RESERVED)).toHaveLength(0);
    });
  });
});
