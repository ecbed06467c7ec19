import { MemoryClaimLedger } from 'nest-sequence';
import { bytes, eventually } from '../support/sequence-test-app';
import {
  claimMetric,
  createClaimCheckTestApp,
  deathReasons,
  publishTicket,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/** Claim Check: the same ticket delivered twice runs the handler once (per channel). */
describe('claim check: a ticket delivered twice', () => {
  let t: ClaimCheckTestApp;
  afterEach(() => t.close());

  const duplicates = () => claimMetric(t, 'duplicates_total', { channel: t.channel });

  it('after it was handled: the copy is acked without running the handler', async () => {
    t = await createClaimCheckTestApp();
    const payload = bytes(5_000, 1);
    const ticket = await t.claimCheck.checkIn(payload, { audience: t.channel });

    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();
    // deleteAfter 'ack' removed the payload: the copy must be told apart from a missing payload.
    expect(await t.store.head(ticket.ref)).toBeUndefined();
    await publishTicket(t.transport, t.channel, ticket);
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    expect(t.transport.actionsOn(t.channel)).toEqual(['ack', 'ack']);
    expect(deathReasons(t.transport, t.channel)).toEqual([]);
    expect(await duplicates()).toBe(1);
  });

  it('a claim whose reply was lost is released: the redelivery is handled at once, not after leaseMs', async () => {
    /** A ledger whose first `claim` is recorded, and then answers with an error (a timeout). */
    class LostClaimReply extends MemoryClaimLedger {
      lost = 1;
      override async claim(...args: Parameters<MemoryClaimLedger['claim']>) {
        const result = await super.claim(...args);
        if (this.lost-- > 0) throw new Error('the reply was lost (injected by the test)');
        return result;
      }
    }
    t = await createClaimCheckTestApp({
      module: {
        tuning: { leaseMs: 60_000 },
      },
      claimCheck: { ledger: new LostClaimReply() },
    });
    const ticket = await t.claimCheck.checkIn(bytes(2_000, 7), { audience: t.channel });

    await publishTicket(t.transport, t.channel, ticket);

    await eventually(() => t.handler.calls === 1, 'the redelivery handled', 3_000);
    await t.transport.whenIdle();
    expect(t.transport.actionsOn(t.channel)).toEqual(['requeue', 'ack']);
  });

  it('a completion the ledger refuses for a moment is tried again: handled once, acked', async () => {
    /** A ledger that fails its first three `complete` calls before recording anything. */
    class BriefOutage extends MemoryClaimLedger {
      failures = 3;
      completes = 0;
      override async complete(...args: Parameters<MemoryClaimLedger['complete']>) {
        this.completes++;
        if (this.failures-- > 0) throw new Error('ledger unreachable (injected by the test)');
        return super.complete(...args);
      }
    }
    const ledger = new BriefOutage();
    t = await createClaimCheckTestApp({
      module: { tuning: { leaseMs: 6_000 } },
      claimCheck: { ledger },
    });
    const ticket = await t.claimCheck.checkIn(bytes(2_000, 9), { audience: t.channel });

    await publishTicket(t.transport, t.channel, ticket);
    await eventually(() => t.transport.actionsOn(t.channel).length > 0, 'settled', 5_000);

    expect(t.transport.actionsOn(t.channel)).toEqual(['ack']);
    expect(t.handler.calls).toBe(1);
    expect(ledger.completes).toBe(4);
  });

  it('two copies queued at once: one handler call, both acked, nothing dead-lettered', async () => {
    t = await createClaimCheckTestApp({ claimCheck: { deleteAfter: 'ttl' } });
    const payload = bytes(5_000, 2);
    const ticket = await t.claimCheck.checkIn(payload, { audience: t.channel });
    // Hold the first call so that the copy arrives while the ticket is being handled.
    let releaseFirst!: () => void;
    const firstHeld = new Promise<void>((resolve) => (releaseFirst = resolve));
    t.handler.read = async (claimed) => {
      await firstHeld;
      return claimed.toBuffer();
    };

    await publishTicket(t.transport, t.channel, ticket);
    await publishTicket(t.transport, t.channel, ticket);
    // The first copy reaches the handler (on a loaded machine this can take a while),
    // then the second gets time to arrive while the first is still held.
    await eventually(() => t.handler.calls === 1, 'the first copy handled', 5_000);
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(t.handler.calls).toBe(1);
    releaseFirst();
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(t.handler.deliveries).toHaveLength(1);
    const actions = t.transport.actionsOn(t.channel);
    expect(actions.filter((action) => action === 'ack')).toHaveLength(2);
    expect(actions).not.toContain('dead-letter');
    expect(t.transport.depth(t.channel)).toBe(0);
    expect(t.transport.unsettled(t.channel)).toBe(0);
    expect(await duplicates()).toBe(1);
  });

  it('publish() once, then the same ticket body again: the handler still runs once', async () => {
    t = await createClaimCheckTestApp({
      claimCheck: {
        inlineMaxBytes: 100,
      },
    });
    const payload = bytes(1_000, 3);
    const receipt = await t.claimCheck.publish(t.channel, payload);
    await t.transport.whenIdle();
    const [original] = t.transport.settlements;
    expect(original.disposition).toEqual({ action: 'ack' });

    await publishTicket(t.transport, t.channel, receipt.ticket ?? {});
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(1);
    expect(t.transport.actionsOn(t.channel)).toEqual(['ack', 'ack']);
    expect(await duplicates()).toBe(1);
  });

  describe('a copy that arrives after the ticket expired', () => {
    const TTL_MS = 400;
    const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
    /** A memory ledger that counts its claims. */
    class CountingLedger extends MemoryClaimLedger {
      claims = 0;
      override claim(...args: Parameters<MemoryClaimLedger['claim']>) {
        this.claims += 1;
        return super.claim(...args);
      }
    }

    it.each(['ack', 'ttl'] as const)(
      'deleteAfter %p, handled before: acked as a duplicate, not dead-lettered expired',
      async (deleteAfter) => {
        t = await createClaimCheckTestApp({ claimCheck: { deleteAfter } });
        const ticket = await t.claimCheck.checkIn(bytes(3_000, 4), {
          audience: t.channel,
          ttlMs: TTL_MS,
        });
        await publishTicket(t.transport, t.channel, ticket);
        await t.transport.whenIdle();
        expect(t.handler.calls).toBe(1);

        await pause(ticket.expiresAt - Date.now() + 50);
        await publishTicket(t.transport, t.channel, ticket);
        await t.transport.whenIdle();

        expect(t.handler.calls).toBe(1);
        expect(deathReasons(t.transport, t.channel)).toEqual([]);
        expect(t.transport.actionsOn(t.channel)).toEqual(['ack', 'ack']);
        expect(await duplicates()).toBe(1);
      },
    );

    it('never handled: dead-lettered expired, and its claim given back', async () => {
      const ledger = new CountingLedger();
      t = await createClaimCheckTestApp({ claimCheck: { ledger } });
      const ticket = await t.claimCheck.checkIn(bytes(3_000, 5), {
        audience: t.channel,
        ttlMs: TTL_MS,
      });
      await pause(ticket.expiresAt - Date.now() + 50);
      await publishTicket(t.transport, t.channel, ticket);
      await t.transport.whenIdle();

      expect(t.handler.calls).toBe(0);
      expect(deathReasons(t.transport, t.channel)).toEqual([
        expect.stringMatching(/^claim-ticket-invalid: claim ticket refused \(expired\)/),
      ]);
      expect(await duplicates()).toBe(0);
      // Released: another copy asks again rather than finding the ticket busy.
      const key = { ticket: `${ticket.store}:${ticket.ref}`, group: t.channel };
      await expect(ledger.claim(key, 'someone-else', 60_000, Date.now())).resolves.toBe('claimed');
    });

    it('handled, but later than expiredGraceMs after its expiry: dead-lettered expired', async () => {
      t = await createClaimCheckTestApp({ claimCheck: { expiredGraceMs: 100 } });
      const ticket = await t.claimCheck.checkIn(bytes(3_000, 6), {
        audience: t.channel,
        ttlMs: TTL_MS,
      });
      await publishTicket(t.transport, t.channel, ticket);
      await t.transport.whenIdle();

      await pause(ticket.expiresAt - Date.now() + 300);
      await publishTicket(t.transport, t.channel, ticket);
      await t.transport.whenIdle();

      expect(t.handler.calls).toBe(1);
      expect(deathReasons(t.transport, t.channel)).toEqual([
        expect.stringMatching(/^claim-ticket-invalid: claim ticket refused \(expired\)/),
      ]);
    });

    it('issued for another channel: dead-lettered expired, the ledger not asked', async () => {
      const ledger = new CountingLedger();
      t = await createClaimCheckTestApp({ claimCheck: { ledger } });
      const ticket = await t.claimCheck.checkIn(bytes(3_000, 7), {
        audience: 'cc.elsewhere',
        ttlMs: TTL_MS,
      });
      await pause(ticket.expiresAt - Date.now() + 50);
      await publishTicket(t.transport, t.channel, ticket);
      await t.transport.whenIdle();

      expect(ledger.claims).toBe(0);
      expect(deathReasons(t.transport, t.channel)).toEqual([
        expect.stringMatching(/^claim-ticket-invalid: claim ticket refused \(expired\)/),
      ]);
    });
  });

  it('an inline payload is not deduplicated: two messages, two calls', async () => {
    // Inline messages carry no ticket to recognise; the guarantee is for tickets only.
    t = await createClaimCheckTestApp();
    await t.claimCheck.publish(t.channel, Buffer.from('same'));
    await t.claimCheck.publish(t.channel, Buffer.from('same'));
    await t.transport.whenIdle();
    expect(t.handler.calls).toBe(2);
    expect(await duplicates()).toBe(0);
  });
});
