import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { ClaimCheckNotFoundError } from 'nest-sequence';
import { type ClaimTicket } from 'nest-sequence/wire';
import { bytes } from '../support/sequence-test-app';
import {
  claimMetric,
  createClaimCheckTestApp,
  deathReasons,
  publishTicket,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/**
 * Claim Check: a genuine ticket whose payload is gone (released, deleted, removed behind the
 * store's back, or deleted while being read) is dead-lettered `claim-check-not-found`, once: no
 * retry can bring the payload back, so it is never requeued.
 */
describe('claim check: a ticket whose payload is gone', () => {
  let t: ClaimCheckTestApp;
  let ticket: ClaimTicket;
  beforeEach(async () => {
    t = await createClaimCheckTestApp();
    ticket = await t.claimCheck.checkIn(bytes(4_000, 1), { audience: t.channel });
  });
  afterEach(() => t.close());

  /** Publishes the ticket, then a good one behind it; checks the fate of both. */
  async function expectNotFound(): Promise<void> {
    const bystander = bytes(1_000, 2);
    const bystanderTicket = await t.claimCheck.checkIn(bystander, { audience: t.channel });
    await publishTicket(t.transport, t.channel, ticket);
    await publishTicket(t.transport, t.channel, bystanderTicket);
    await t.transport.whenIdle();

    const reasons = deathReasons(t.transport, t.channel);
    expect(reasons).toHaveLength(1);
    expect(reasons[0].startsWith('claim-check-not-found: ')).toBe(true);
    expect(reasons[0]).toContain(ticket.ref);
    expect(t.transport.actionsOn(t.channel)).toEqual(['dead-letter', 'ack']);
    expect(t.transport.depth(t.channel)).toBe(0);
    expect(t.transport.unsettled(t.channel)).toBe(0);
    expect(t.handler.deliveries.map((d) => d.bytes.equals(bystander))).toEqual([true]);
    expect(
      await claimMetric(t, 'rejected_total', {
        channel: t.channel,
        reason: 'claim-check-not-found',
      }),
    ).toBe(1);
  }

  it('released before delivery: dead-lettered, the handler not called', async () => {
    expect(await t.claimCheck.release(ticket)).toBe(true);
    await expectNotFound();
    expect(t.handler.calls).toBe(1); // the bystander
  });

  it('deleted from the store before delivery: dead-lettered, the handler not called', async () => {
    expect(await t.store.delete(ticket.ref)).toBe(true);
    await expectNotFound();
    expect(t.handler.calls).toBe(1);
  });

  it('its bytes removed from disk behind the store’s back: dead-lettered', async () => {
    await rm(join(t.root, ...ticket.ref.split('/')));
    await expectNotFound();
    expect(t.handler.calls).toBe(1);
  });

  it('deleted while the handler reads it: dead-lettered, the handler not retried', async () => {
    let victimCalls = 0;
    t.handler.read = async (payload) => {
      if (payload.ticket?.ref === ticket.ref) {
        victimCalls++;
        await t.store.delete(ticket.ref);
      }
      return payload.toBuffer();
    };
    await expectNotFound();
    expect(victimCalls).toBe(1);
    expect(t.handler.readErrors).toHaveLength(1);
    expect(t.handler.readErrors[0]).toBeInstanceOf(ClaimCheckNotFoundError);
  });

  it('published again after it was dead-lettered: dead-lettered again, never looping', async () => {
    await t.claimCheck.release(ticket);
    for (let round = 0; round < 3; round++) {
      await publishTicket(t.transport, t.channel, ticket);
      await t.transport.whenIdle();
    }
    expect(t.transport.actionsOn(t.channel)).toEqual(['dead-letter', 'dead-letter', 'dead-letter']);
    expect(t.handler.calls).toBe(0);
  });
});
