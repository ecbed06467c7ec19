import { bytes } from '../support/sequence-test-app';
import { eventually } from '../support/sequence-test-app';
import {
  createClaimCheckTestApp,
  type ClaimCheckTestApp,
} from '../claim-check/claim-check-test-app';
import { recordEvents } from './event-recorder';

/** Claim Check's lifecycle events, on the embedded defaults (filesystem payload store). */
describe('lifecycle events: Claim Check', () => {
  let t: ClaimCheckTestApp | undefined;
  afterEach(async () => {
    await t?.close();
    t = undefined;
  });

  it('a ticket published and consumed: checked in, checked out by the handler, deleted as consumed', async () => {
    t = await createClaimCheckTestApp({
      handlers: [{ channel: 'events.claims', deleteAfter: 'ack' }],
    });
    const recorder = recordEvents(t.app);
    const payload = bytes(300_000, 12);

    const receipt = await t.claimCheck.publish(t.channel, payload);
    await eventually(() => t!.handler.deliveries.length === 1, 'the payload handled');
    await t.transport.whenIdle();

    expect(receipt.via).toBe('ticket');
    const ref = receipt.ticket!.ref;
    const base = { at: expect.any(Number), channel: 'events.claims', ref, store: 'filesystem' };
    expect(recorder.events).toEqual([
      {
        ...base,
        type: 'claim.checked-in',
        bytes: 300_000,
        sha256: receipt.ticket!.sha256,
        expiresAt: receipt.ticket!.expiresAt,
        audience: ['events.claims'],
        durationMs: expect.any(Number),
      },
      { ...base, type: 'claim.checked-out', bytes: 300_000, durationMs: expect.any(Number) },
      { ...base, type: 'claim.deleted', reason: 'consumed' },
    ]);
  });

  it('checkIn and release by hand: checked in with no audience, deleted as released', async () => {
    t = await createClaimCheckTestApp();
    const recorder = recordEvents(t.app);

    const ticket = await t.claimCheck.checkIn(bytes(10_000, 1));
    await t.claimCheck.checkOut(ticket);
    await t.claimCheck.release(ticket);

    expect(recorder.events.map((event) => [event.type, event.channel])).toEqual([
      ['claim.checked-in', ''],
      ['claim.checked-out', ''],
      ['claim.deleted', ''],
    ]);
    expect(recorder.events[2]).toMatchObject({ ref: ticket.ref, reason: 'released' });
  });

  it("checkOut by hand: checked out with the ticket's bytes and the time the check-out took", async () => {
    t = await createClaimCheckTestApp();
    const ticket = await t.claimCheck.checkIn(bytes(10_000, 3));
    const recorder = recordEvents(t.app);
    // A clock that moves 5 ms at each reading: the duration is measured, not left at 0.
    let now = Date.now();
    const clock = jest.spyOn(Date, 'now').mockImplementation(() => (now += 5));
    try {
      await t.claimCheck.checkOut(ticket);
    } finally {
      clock.mockRestore();
    }

    expect(recorder.events).toEqual([
      {
        type: 'claim.checked-out',
        at: expect.any(Number),
        channel: '',
        ref: ticket.ref,
        store: 'filesystem',
        bytes: 10_000,
        durationMs: expect.any(Number),
      },
    ]);
    expect((recorder.events[0] as { durationMs: number }).durationMs).toBeGreaterThan(0);
  });

  it('the orphan sweeper deleting an expired payload: deleted with the reason expired', async () => {
    t = await createClaimCheckTestApp();
    const ticket = await t.claimCheck.checkIn(bytes(10_000, 2), { ttlMs: 1_000 });
    const recorder = recordEvents(t.app);

    await t.sweeper.sweep(Date.now() + 24 * 3_600_000);

    expect(recorder.events).toEqual([
      {
        type: 'claim.deleted',
        at: expect.any(Number),
        channel: '',
        ref: ticket.ref,
        store: 'filesystem',
        reason: 'expired',
      },
    ]);
  });
});
