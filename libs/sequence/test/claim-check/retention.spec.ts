import { MemoryClaimLedger } from 'nest-sequence';
import { type ClaimTicket } from 'nest-sequence/wire';
import { bytes } from '../support/sequence-test-app';
import {
  claimMetric,
  createClaimCheckTestApp,
  deathReasons,
  filesUnder,
  publishTicket,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/**
 * Claim Check retention per consuming channel: `'ack'` deletes the payload once its handler
 * succeeded, `'ttl'` leaves it to the sweeper at its expiry, `{ consumers: N }` deletes it once N
 * distinct channels handled it; a payload whose handler kept failing is kept until it expires.
 */
/** A ledger whose `complete` call number `lostAt` is recorded, and then answers with an error. */
class LostReply extends MemoryClaimLedger {
  private completes = 0;

  constructor(private readonly lostAt: number) {
    super();
  }

  override async complete(...args: Parameters<MemoryClaimLedger['complete']>) {
    const result = await super.complete(...args);
    if (++this.completes === this.lostAt) {
      throw new Error('the reply was lost (injected by the test)');
    }
    return result;
  }
}

describe('claim check: retention', () => {
  let t: ClaimCheckTestApp;
  afterEach(() => t.close());

  const deletedAs = (reason: string) =>
    claimMetric(t, 'payloads_deleted_total', { store: 'filesystem', reason });

  describe("deleteAfter: 'ack'", () => {
    it('deletes the payload when a redelivery finds its handling recorded but the reply to that record was lost', async () => {
      t = await createClaimCheckTestApp({
        handlers: [{ channel: 'cc.ack', deleteAfter: 'ack' }],
        claimCheck: { ledger: new LostReply(1) },
      });
      const ticket = await t.claimCheck.checkIn(bytes(2_000, 9), { audience: t.channel });

      await publishTicket(t.transport, t.channel, ticket);
      await t.transport.whenIdle();

      // Handled once; the redelivery finds it done. Before, it was acked without deleting, and
      // the payload waited for its expiry.
      expect(t.handler.calls).toBe(1);
      expect(await t.store.head(ticket.ref)).toBeUndefined();
    });

    it('deletes the payload after the handler succeeded, not before', async () => {
      t = await createClaimCheckTestApp({ handlers: [{ channel: 'cc.ack', deleteAfter: 'ack' }] });
      const payload = bytes(2_000, 1);
      const ticket = await t.claimCheck.checkIn(payload, { audience: t.channel });
      let storedDuringHandler: unknown;
      t.handler.read = async (claimed) => {
        const read = await claimed.toBuffer();
        storedDuringHandler = await t.store.head(ticket.ref);
        return read;
      };

      await publishTicket(t.transport, t.channel, ticket);
      await t.transport.whenIdle();

      expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
      expect(storedDuringHandler).toMatchObject({ bytes: payload.length });
      expect(await t.store.head(ticket.ref)).toBeUndefined();
      expect(await filesUnder(t.root)).toEqual([]);
      expect(t.transport.actionsOn(t.channel)).toEqual(['ack']);
      expect(await deletedAs('consumed')).toBe(1);
    });

    it('is the module default', async () => {
      t = await createClaimCheckTestApp();
      const ticket = await t.claimCheck.checkIn(bytes(2_000, 2), { audience: t.channel });
      await publishTicket(t.transport, t.channel, ticket);
      await t.transport.whenIdle();
      expect(t.handler.calls).toBe(1);
      expect(await t.store.head(ticket.ref)).toBeUndefined();
    });
  });

  describe("deleteAfter: 'ttl'", () => {
    it('keeps the payload after the handler; the sweeper deletes it expiredGraceMs after its expiry', async () => {
      t = await createClaimCheckTestApp({ handlers: [{ channel: 'cc.ttl', deleteAfter: 'ttl' }] });
      const ticket = await t.claimCheck.checkIn(bytes(2_000, 3), {
        audience: t.channel,
        ttlMs: 60_000,
      });
      await publishTicket(t.transport, t.channel, ticket);
      await t.transport.whenIdle();

      expect(t.handler.calls).toBe(1);
      expect(await t.store.head(ticket.ref)).toBeDefined();
      const deletableAt = ticket.expiresAt + t.options.claimCheck.expiredGraceMs;
      expect(await t.sweeper.sweep(deletableAt - 1)).toEqual({ expired: 0, orphaned: 0 });
      expect(await t.store.head(ticket.ref)).toBeDefined();

      expect(await t.sweeper.sweep(deletableAt)).toEqual({ expired: 1, orphaned: 0 });
      expect(await t.store.head(ticket.ref)).toBeUndefined();
      expect(await deletedAs('expired')).toBe(1);
      expect(await deletedAs('consumed')).toBe(0);
    });

    it('can be the module default, and a channel can still choose ack', async () => {
      t = await createClaimCheckTestApp({
        claimCheck: { deleteAfter: 'ttl' },
        handlers: [{ channel: 'cc.default' }, { channel: 'cc.own', deleteAfter: 'ack' }],
      });
      const kept = await t.claimCheck.checkIn(bytes(100, 4), { audience: 'cc.default' });
      const deleted = await t.claimCheck.checkIn(bytes(100, 5), { audience: 'cc.own' });
      await publishTicket(t.transport, 'cc.default', kept);
      await publishTicket(t.transport, 'cc.own', deleted);
      await t.transport.whenIdle();

      expect(t.handlerOn('cc.default').calls).toBe(1);
      expect(t.handlerOn('cc.own').calls).toBe(1);
      expect(await t.store.head(kept.ref)).toBeDefined();
      expect(await t.store.head(deleted.ref)).toBeUndefined();
    });
  });

  describe('deleteAfter: { consumers: 2 }', () => {
    const twoChannels = () =>
      createClaimCheckTestApp({
        handlers: [
          { channel: 'cc.billing', deleteAfter: { consumers: 2 } },
          { channel: 'cc.audit', deleteAfter: { consumers: 2 } },
        ],
      });

    it('keeps the payload after the first channel, deletes it after the second', async () => {
      t = await twoChannels();
      const payload = bytes(3_000, 6);
      const ticket = await t.claimCheck.checkIn(payload, { audience: ['cc.billing', 'cc.audit'] });

      await publishTicket(t.transport, 'cc.billing', ticket);
      await t.transport.whenIdle();
      expect(t.handlerOn('cc.billing').deliveries[0].bytes.equals(payload)).toBe(true);
      expect(await t.store.head(ticket.ref)).toBeDefined();

      await publishTicket(t.transport, 'cc.audit', ticket);
      await t.transport.whenIdle();
      expect(t.handlerOn('cc.audit').deliveries[0].bytes.equals(payload)).toBe(true);
      expect(await t.store.head(ticket.ref)).toBeUndefined();
      expect(await deletedAs('consumed')).toBe(1);
    });

    it('deletes the payload when the reply to the second completion was lost', async () => {
      t = await createClaimCheckTestApp({
        handlers: [
          { channel: 'cc.billing', deleteAfter: { consumers: 2 } },
          { channel: 'cc.audit', deleteAfter: { consumers: 2 } },
        ],
        claimCheck: { ledger: new LostReply(2) },
      });
      const ticket = await t.claimCheck.checkIn(bytes(3_000, 1), {
        audience: ['cc.billing', 'cc.audit'],
      });

      await publishTicket(t.transport, 'cc.billing', ticket);
      await t.transport.whenIdle();
      await publishTicket(t.transport, 'cc.audit', ticket);
      await t.transport.whenIdle();

      // cc.audit's redelivery finds its completion recorded, and asks the count again.
      expect(t.handlerOn('cc.billing').calls).toBe(1);
      expect(t.handlerOn('cc.audit').calls).toBe(1);
      expect(await t.store.head(ticket.ref)).toBeUndefined();
      expect(await deletedAs('consumed')).toBe(1);
    });

    it('one channel handling the ticket twice counts once: the payload stays', async () => {
      t = await twoChannels();
      const ticket = await t.claimCheck.checkIn(bytes(3_000, 7), { audience: t.channel });
      await publishTicket(t.transport, 'cc.billing', ticket);
      await t.transport.whenIdle();
      await publishTicket(t.transport, 'cc.billing', ticket);
      await t.transport.whenIdle();

      expect(t.handlerOn('cc.billing').calls).toBe(1);
      expect(await t.store.head(ticket.ref)).toBeDefined();
    });

    it('published to both at once: each handler once, then deleted', async () => {
      t = await twoChannels();
      const ticket = await t.claimCheck.checkIn(bytes(3_000, 8), {
        audience: ['cc.billing', 'cc.audit'],
      });
      await Promise.all([
        publishTicket(t.transport, 'cc.billing', ticket),
        publishTicket(t.transport, 'cc.audit', ticket),
      ]);
      await t.transport.whenIdle();

      expect(t.handlerOn('cc.billing').deliveries).toHaveLength(1);
      expect(t.handlerOn('cc.audit').deliveries).toHaveLength(1);
      expect(await t.store.head(ticket.ref)).toBeUndefined();
    });
  });

  describe('a handler that keeps failing', () => {
    let ticket: ClaimTicket;
    beforeEach(async () => {
      t = await createClaimCheckTestApp({
        handlers: [{ channel: 'cc.failing', handlerRetry: { attempts: 2, baseDelayMs: 1 } }],
      });
      ticket = await t.claimCheck.checkIn(bytes(2_000, 9), { audience: t.channel, ttlMs: 60_000 });
      t.handler.failNext = Number.MAX_SAFE_INTEGER;
      await publishTicket(t.transport, t.channel, ticket);
      await t.transport.whenIdle();
    });

    it('is retried per its policy, then the message is dead-lettered handler-failed', async () => {
      expect(t.handler.calls).toBe(2);
      const reasons = deathReasons(t.transport, t.channel);
      expect(reasons).toHaveLength(1);
      expect(reasons[0]).toMatch(/^handler-failed: ticket filesystem:\S+: handler failed 2 time/);
      expect(t.transport.actionsOn(t.channel)).toEqual(['dead-letter']);
    });

    it('keeps the payload (under ack) until it expires, then the sweeper deletes it', async () => {
      expect(await t.store.head(ticket.ref)).toBeDefined();
      const deletableAt = ticket.expiresAt + t.options.claimCheck.expiredGraceMs;
      expect(await t.sweeper.sweep(deletableAt - 1)).toEqual({ expired: 0, orphaned: 0 });
      expect(await t.sweeper.sweep(deletableAt)).toEqual({ expired: 1, orphaned: 0 });
      expect(await t.store.head(ticket.ref)).toBeUndefined();
    });

    it('inline, the same: retried, then dead-lettered handler-failed with its body', async () => {
      await t.claimCheck.publish(t.channel, Buffer.from('inline payload'));
      await t.transport.whenIdle();
      expect(t.handler.calls).toBe(4); // two for the ticket above, two for this one
      const dead = t.transport.peek(`${t.channel}.dlq`);
      expect(dead).toHaveLength(2);
      expect(String(dead[1].headers['x-death-reason'])).toMatch(
        /^handler-failed: an inline payload: handler failed 2 time/,
      );
      expect(dead[1].body.toString()).toBe('inline payload');
    });

    it('does not count as handled: the dead letter, published again, runs the handler', async () => {
      t.handler.failNext = 0;
      const [dead] = t.transport.take(`${t.channel}.dlq`);
      await t.transport.publish(t.channel, dead.body, { 'x-claim-check': 1 });
      await t.transport.whenIdle();
      expect(t.handler.deliveries).toHaveLength(1);
      expect(await t.store.head(ticket.ref)).toBeUndefined();
    });
  });
});
