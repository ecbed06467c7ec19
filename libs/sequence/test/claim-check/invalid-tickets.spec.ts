import { randomBytes } from 'node:crypto';
import { ClaimTicketKeyring, signTicket, type ClaimTicket } from 'nest-sequence/wire';
import { MAX_TICKET_BODY_BYTES, serializeTicket } from '../../src/core/claim-ticket';
import { bytes } from '../support/sequence-test-app';
import {
  claimMetric,
  createClaimCheckTestApp,
  deathReasons,
  fieldsOf,
  publishTicket,
  signedByApp,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/**
 * Claim Check: a ticket that is not exactly what this side signed (tampered, unsigned, expired,
 * under an unknown key, not a ticket at all) or that names a store this side does not have is
 * dead-lettered with a reason, at once: the handler never runs for it, it is never requeued, and
 * the messages behind it are still delivered.
 */
describe('claim check: invalid tickets', () => {
  let t: ClaimCheckTestApp;
  let victim: Buffer;
  let ticket: ClaimTicket;
  beforeEach(async () => {
    t = await createClaimCheckTestApp();
    victim = bytes(3_000, 1);
    ticket = await t.claimCheck.checkIn(victim, {
      audience: t.channel,
      contentType: 'application/octet-stream',
    });
  });
  afterEach(() => t.close());

  /**
   * Publishes `body` as a ticket message and then a genuine ticket behind it; checks the first
   * was dead-lettered with a reason matching `reason` and only the second reached the handler.
   */
  async function expectRefused(body: Buffer, code: string, reason: RegExp): Promise<void> {
    const bystander = bytes(2_000, 2);
    const bystanderTicket = await t.claimCheck.checkIn(bystander, { audience: t.channel });
    await publishTicket(t.transport, t.channel, body);
    await publishTicket(t.transport, t.channel, bystanderTicket);
    await t.transport.whenIdle();

    const reasons = deathReasons(t.transport, t.channel);
    expect(reasons).toHaveLength(1);
    expect(reasons[0].startsWith(`${code}: `)).toBe(true);
    expect(reasons[0]).toMatch(reason);
    const [dead] = t.transport.peek(`${t.channel}.dlq`);
    expect(dead.body.equals(body)).toBe(true);
    expect(dead.headers['x-claim-check']).toBe(1);

    expect(t.handler.calls).toBe(1);
    expect(t.handler.deliveries[0].bytes.equals(bystander)).toBe(true);
    expect(t.transport.actionsOn(t.channel)).toEqual(['dead-letter', 'ack']);
    expect(t.transport.depth(t.channel)).toBe(0);
    expect(t.transport.unsettled(t.channel)).toBe(0);
    expect(await claimMetric(t, 'rejected_total', { channel: t.channel, reason: code })).toBe(1);
  }

  /** The genuine ticket as JSON with `change` applied, not signed again. */
  function tampered(change: (fields: Record<string, unknown>) => void): Buffer {
    const fields: Record<string, unknown> = { ...ticket };
    change(fields);
    return Buffer.from(JSON.stringify(fields));
  }

  const flipHex = (hex: string) => (hex[0] === '0' ? '1' : '0') + hex.slice(1);

  describe('tampered after signing', () => {
    it.each<[string, (fields: Record<string, unknown>) => void]>([
      ['store', (f) => (f.store = 'filesystem2')],
      ['ref', (f) => (f.ref = String(f.ref).replace(/.$/, (c) => (c === 'a' ? 'b' : 'a')))],
      ['bytes', (f) => (f.bytes = Number(f.bytes) + 1)],
      ['sha256', (f) => (f.sha256 = flipHex(String(f.sha256)))],
      ['contentType', (f) => (f.contentType = 'text/html')],
      ['contentType removed', (f) => delete f.contentType],
      ['expiresAt', (f) => (f.expiresAt = Number(f.expiresAt) + 86_400_000)],
      // The first character: all six of its bits are signature bits (the last one's are not all).
      [
        'sig',
        (f) => (f.sig = (String(f.sig).startsWith('A') ? 'B' : 'A') + String(f.sig).slice(1)),
      ],
    ])('%s: dead-lettered as a bad signature', async (_field, change) => {
      await expectRefused(
        tampered(change),
        'claim-ticket-invalid',
        /^claim-ticket-invalid: claim ticket refused \(bad-signature\)/,
      );
    });

    it('a signature taken from another genuine ticket: bad signature', async () => {
      const other = await t.claimCheck.checkIn(bytes(10, 3), { audience: t.channel });
      await expectRefused(
        tampered((f) => (f.sig = other.sig)),
        'claim-ticket-invalid',
        /\(bad-signature\)/,
      );
    });

    it('an unsigned field added: malformed', async () => {
      await expectRefused(
        tampered((f) => (f.admin = true)),
        'claim-ticket-invalid',
        /\(malformed\): unknown field "admin"/,
      );
    });

    it('another format version: malformed', async () => {
      await expectRefused(
        tampered((f) => (f.v = 3)),
        'claim-ticket-invalid',
        /\(malformed\)/,
      );
    });
  });

  it('unsigned: dead-lettered as unsigned', async () => {
    await expectRefused(
      tampered((f) => delete f.sig),
      'claim-ticket-invalid',
      /\(unsigned\)/,
    );
  });

  it('signed by a key this side does not hold: dead-lettered as an unknown key', async () => {
    const stranger = new ClaimTicketKeyring([{ id: 'stranger', secret: randomBytes(32) }]);
    await expectRefused(
      serializeTicket(signTicket(fieldsOf(ticket), stranger)),
      'claim-ticket-invalid',
      /\(unknown-key\).*"stranger"/,
    );
  });

  it('with its key id changed to one this side does not hold: unknown key', async () => {
    await expectRefused(
      tampered((f) => (f.kid = 'retired-2020')),
      'claim-ticket-invalid',
      /\(unknown-key\)/,
    );
  });

  it('expired: dead-lettered as expired, though genuine and its payload still there', async () => {
    const short = await t.claimCheck.checkIn(bytes(100, 4), { audience: t.channel, ttlMs: 500 });
    await new Promise((resolve) => setTimeout(resolve, 600));
    expect(await t.store.head(short.ref)).toBeDefined();
    await expectRefused(serializeTicket(short), 'claim-ticket-invalid', /\(expired\)/);
  });

  it('a body that is not JSON: malformed', async () => {
    await expectRefused(
      Buffer.from('{"store":"filesystem",'),
      'claim-ticket-invalid',
      /\(malformed\): the body is not valid JSON/,
    );
  });

  it('a body that is not UTF-8: malformed', async () => {
    await expectRefused(
      Buffer.from([0x7b, 0xff, 0xfe, 0x7d]),
      'claim-ticket-invalid',
      /\(malformed\): the body is not valid UTF-8/,
    );
  });

  it('JSON that is not an object: malformed', async () => {
    await expectRefused(Buffer.from('[1,2,3]'), 'claim-ticket-invalid', /\(malformed\)/);
  });

  it('a body over 8 KiB, genuine ticket or not: malformed, refused before parsing', async () => {
    // A genuine ticket padded with whitespace: valid JSON, valid signature, too large.
    const genuine = serializeTicket(ticket);
    const padded = Buffer.concat([
      genuine,
      Buffer.alloc(MAX_TICKET_BODY_BYTES + 1 - genuine.length, ' '),
    ]);
    expect(padded.length).toBe(MAX_TICKET_BODY_BYTES + 1);
    await expectRefused(padded, 'claim-ticket-invalid', /over the 8192-byte limit/);
  });

  it('a genuine ticket naming a store this side does not have: unknown-payload-store', async () => {
    const elsewhere = signedByApp(t, { ...fieldsOf(ticket), store: 'archive-eu' });
    await expectRefused(
      serializeTicket(elsewhere),
      'unknown-payload-store',
      /"archive-eu"|archive-eu/,
    );
  });

  it('leaves the payload of a refused ticket where it is', async () => {
    await expectRefused(
      tampered((f) => (f.expiresAt = Number(f.expiresAt) + 1)),
      'claim-ticket-invalid',
      /\(bad-signature\)/,
    );
    // A forged ticket must not be able to delete (or otherwise touch) what a real one names.
    expect(await t.store.head(ticket.ref)).toMatchObject({ bytes: victim.length });
  });
});
