import { SplitterService } from 'nest-sequence';
import {
  buildFragmentHeaders,
  ClaimCheckHeader,
  crc32,
  fragmentAudience,
  SequenceHeader,
  serializeTicket,
  sha256Hex,
  type ClaimTicket,
  type HeaderMap,
} from 'nest-sequence/wire';
import { PayloadParking } from '../../src/claim-check/payload-parking';
import { bytes } from '../support/sequence-test-app';
import {
  createClaimCheckTestApp,
  deathReasons,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

const ORDERS = 'cc.orders';

interface Published {
  readonly body: Buffer;
  readonly headers: HeaderMap;
}

/**
 * A fragment sent `via: 'claim-check'` travels as a ticket signed for the fragment it carries
 * (its sequence id and position): a copy of that ticket under another fragment's headers is a
 * forgery, dead-lettered `wrong-audience` as it arrives, before any of its bytes are stored.
 */
describe('claim check: a parked fragment is bound to its sequence and position', () => {
  let t: ClaimCheckTestApp;
  /** The fragments of a genuine sequence as the splitter published them. */
  let genuine: Published[];
  const payload = bytes(128 * 1024, 9);

  beforeEach(async () => {
    // Parked bodies kept past their ack: a forger holding copies of the tickets finds them.
    // Tickets shorter-lived than the sequence store's record of the sequence (1 h): a copy can
    // come after its ticket expired, and still meet the completed sequence.
    t = await createClaimCheckTestApp({
      handlers: [{ channel: ORDERS }],
      claimCheck: { deleteAfter: 'ttl', ttlMs: 60_000 },
      module: { handlerRetry: { attempts: 1 } },
    });
    const publish = jest.spyOn(t.transport, 'publish');
    await t.app.get(SplitterService).send(ORDERS, payload, {
      via: 'claim-check',
      fragmentBytes: 64 * 1024,
      sequenceId: 'genuine',
    });
    await t.transport.whenIdle();
    genuine = publish.mock.calls
      .filter(([channel]) => channel === ORDERS)
      .map(([, body, headers]) => ({ body, headers }));
    // Published concurrently: in position order for the test.
    genuine.sort(
      (a, b) =>
        Number(a.headers[SequenceHeader.position]) - Number(b.headers[SequenceHeader.position]),
    );
    publish.mockRestore();
    expect(genuine).toHaveLength(2);
    expect(t.handlerOn(ORDERS).deliveries.map((d) => d.bytes.equals(payload))).toEqual([true]);
  });
  afterEach(async () => {
    jest.restoreAllMocks();
    await t.close();
  });

  it("refuses a fragment of another sequence carrying the genuine sequence's tickets", async () => {
    // The same positions, bodies and checksums: only the sequence id is the forger's.
    for (const { body, headers } of genuine) {
      await t.transport.publish(ORDERS, body, { ...headers, [SequenceHeader.id]: 'forged' });
    }
    await t.transport.whenIdle();

    expect(t.handlerOn(ORDERS).calls).toBe(1);
    expect(deathReasons(t.transport, ORDERS)).toEqual([
      expect.stringMatching(
        /^wrong-audience: the ticket was issued for sequence genuine fragment 1, not for sequence forged fragment 1$/,
      ),
      expect.stringMatching(
        /^wrong-audience: the ticket was issued for sequence genuine fragment 2, not for sequence forged fragment 2$/,
      ),
    ]);
  });

  it('refuses a fragment carrying the ticket of another position of the sequence', async () => {
    const [first, second] = genuine;
    // Fragment 1 of a fresh sequence with fragment 2's ticket and checksum.
    await t.transport.publish(ORDERS, second.body, {
      ...first.headers,
      [SequenceHeader.id]: 'forged',
      [SequenceHeader.crc32]: second.headers[SequenceHeader.crc32],
    });
    await t.transport.whenIdle();

    expect(deathReasons(t.transport, ORDERS)).toEqual([
      expect.stringMatching(
        /^wrong-audience: the ticket was issued for sequence genuine fragment 2, not for sequence forged fragment 1$/,
      ),
    ]);
  });

  it("dead-letters an expired copy under another fragment's headers, not acked as a duplicate", async () => {
    const [first, second] = genuine;
    const expiresAt = (body: Buffer) =>
      (JSON.parse(body.toString('utf8')) as ClaimTicket).expiresAt;
    // Past both tickets' expiry, within the sequence store's record of the completed sequence.
    const later = Math.max(expiresAt(first.body), expiresAt(second.body)) + 60_000;
    jest.spyOn(Date, 'now').mockReturnValue(later);
    const settled = t.transport.actionsOn(ORDERS).length;

    // Each position's ticket (and checksum) under the other's headers: positions the sequence
    // store holds, of a sequence it completed. Only a genuine copy is a duplicate of one.
    await t.transport.publish(ORDERS, second.body, {
      ...first.headers,
      [SequenceHeader.crc32]: second.headers[SequenceHeader.crc32],
    });
    await t.transport.publish(ORDERS, first.body, {
      ...second.headers,
      [SequenceHeader.crc32]: first.headers[SequenceHeader.crc32],
    });
    await t.transport.whenIdle();
    // The genuine copy, expired too, is acked as the duplicate it is.
    await t.transport.publish(ORDERS, first.body, first.headers);
    await t.transport.whenIdle();

    expect(t.handlerOn(ORDERS).calls).toBe(1);
    // Refused for its expiry, checked before its audience, as for any ticket.
    expect(deathReasons(t.transport, ORDERS)).toEqual([
      expect.stringMatching(/^claim-ticket-invalid: claim ticket refused \(expired\)/),
      expect.stringMatching(/^claim-ticket-invalid: claim ticket refused \(expired\)/),
    ]);
    expect(t.transport.actionsOn(ORDERS).slice(settled)).toEqual([
      'dead-letter',
      'dead-letter',
      'ack',
    ]);
  });

  it('takes a fragment ticket that names no fragment (version 2), parked before tickets did', async () => {
    const body = bytes(2_000, 10);
    const ticket = await t.app.get(PayloadParking).park(body, {}, true, [fragmentAudience(ORDERS)]);
    expect(ticket.v).toBe(2);
    const headers = buildFragmentHeaders({
      sequenceId: 'unbound',
      position: 1,
      size: 1,
      last: true,
      crc32: crc32(body),
      sha256: sha256Hex(body),
      bytes: body.length,
    });

    await t.transport.publish(ORDERS, serializeTicket(ticket), {
      ...headers,
      [ClaimCheckHeader.claimCheck]: 1,
    });
    await t.transport.whenIdle();

    expect(deathReasons(t.transport, ORDERS)).toEqual([]);
    const { deliveries } = t.handlerOn(ORDERS);
    expect(deliveries).toHaveLength(2);
    expect(deliveries[1].bytes.equals(body)).toBe(true);
  });
});
