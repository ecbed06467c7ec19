import { serializeTicket } from '../../src/core/claim-ticket';
import { bytes } from '../support/sequence-test-app';
import {
  claimMetric,
  createClaimCheckTestApp,
  deathReasons,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/**
 * Claim Check: the `x-claim-check` header decides whether a body is a ticket. Sent as a byte
 * array by another program's AMQP client (a Python producer, say), it still means a ticket; a
 * value that means neither a ticket nor an inline payload is dead-lettered, never handed to the
 * handler as if the body were the payload.
 */
describe('claim check: the x-claim-check header', () => {
  let t: ClaimCheckTestApp;
  beforeEach(async () => (t = await createClaimCheckTestApp()));
  afterEach(() => t.close());

  it('sent as the bytes "1": the ticket is claimed and the handler gets the parked payload', async () => {
    const payload = bytes(3_000, 1);
    const ticket = await t.claimCheck.checkIn(payload, { audience: t.channel });
    await t.transport.publish(t.channel, serializeTicket(ticket), {
      'x-claim-check': Buffer.from('1') as unknown as string,
    });
    await t.transport.whenIdle();

    expect(t.handler.deliveries).toHaveLength(1);
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    expect(t.handler.deliveries[0].payload.ticket).toEqual(ticket);
    expect(deathReasons(t.transport, t.channel)).toEqual([]);
  });

  it('sent as the bytes "0": an inline payload', async () => {
    const payload = bytes(100, 2);
    await t.transport.publish(t.channel, payload, {
      'x-claim-check': Buffer.from('0') as unknown as string,
    });
    await t.transport.whenIdle();

    expect(t.handler.deliveries).toHaveLength(1);
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    expect(t.handler.deliveries[0].payload.ticket).toBeUndefined();
  });

  it.each<[string, string | number | Buffer]>([
    ['the bytes "yes"', Buffer.from('yes')],
    ['the string "yes"', 'yes'],
    ['the number 2', 2],
  ])('%s: dead-lettered malformed-header, the handler not called', async (_what, value) => {
    const ticket = await t.claimCheck.checkIn(bytes(3_000, 3), { audience: t.channel });
    await t.transport.publish(t.channel, serializeTicket(ticket), {
      'x-claim-check': value as unknown as string,
    });
    await t.transport.whenIdle();

    expect(t.handler.calls).toBe(0);
    const reasons = deathReasons(t.transport, t.channel);
    expect(reasons).toHaveLength(1);
    expect(reasons[0]).toMatch(/^malformed-header: x-claim-check is /);
    expect(
      await claimMetric(t, 'rejected_total', { channel: t.channel, reason: 'malformed-header' }),
    ).toBe(1);
  });
});

/**
 * The `content-type` of an inline payload sent as a byte array (a Java producer's `byte[]` AMQP
 * header) is read as its UTF-8 text, as every other header of the contract is: dropped, a JSON
 * payload would reach a `@Payload()` as a Buffer instead of its decoded value.
 */
describe('claim check: a content-type sent as bytes', () => {
  let t: ClaimCheckTestApp;
  beforeEach(async () => (t = await createClaimCheckTestApp()));
  afterEach(() => t.close());

  it('is the inline payload content type, as text', async () => {
    const payload = Buffer.from('{"studyId":"CT-7"}');
    await t.transport.publish(t.channel, payload, {
      'content-type': Buffer.from('application/json') as unknown as string,
    });
    await t.transport.whenIdle();

    expect(t.handler.deliveries).toHaveLength(1);
    expect(t.handler.deliveries[0].payload.contentType).toBe('application/json');
    expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    expect(deathReasons(t.transport, t.channel)).toEqual([]);
  });
});
