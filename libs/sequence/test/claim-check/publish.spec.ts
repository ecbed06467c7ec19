import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import { MAX_TICKET_BODY_BYTES } from '../../src/core/claim-ticket';
import { bytes } from '../support/sequence-test-app';
import {
  createClaimCheckTestApp,
  publishTicket,
  type ClaimCheckTestApp,
} from './claim-check-test-app';

/**
 * Claim Check, sender side: `publish()` sends small payloads inline and parks the rest behind a
 * ticket; either way the `@ClaimCheck` handler gets the payload, its content type and headers,
 * never the ticket in its place.
 */
describe('claim check: publish', () => {
  const THRESHOLD = 1_024;
  let t: ClaimCheckTestApp;
  beforeEach(async () => {
    t = await createClaimCheckTestApp({
      claimCheck: {
        inlineMaxBytes: THRESHOLD,
      },
    });
  });
  afterEach(() => t.close());

  /** Publishes, waits until the handler is done, and returns the receipt and what it got. */
  async function publishAndReceive(payload: Buffer | Readable, expected: Buffer) {
    const receipt = await t.claimCheck.publish(t.channel, payload);
    await t.transport.whenIdle();
    expect(t.handler.deliveries).toHaveLength(1);
    const [delivery] = t.handler.deliveries;
    expect(delivery.bytes.equals(expected)).toBe(true);
    return { receipt, delivery };
  }

  describe('size threshold', () => {
    it('sends a Buffer of exactly threshold bytes inline', async () => {
      const payload = bytes(THRESHOLD, 1);
      const { receipt, delivery } = await publishAndReceive(payload, payload);
      expect(receipt).toMatchObject({ channel: t.channel, via: 'inline', bytes: THRESHOLD });
      expect(delivery.payload.via).toBe('inline');
      expect(delivery.payload.bytes).toBe(THRESHOLD);
    });

    it('sends a Buffer of threshold + 1 bytes as a ticket', async () => {
      const payload = bytes(THRESHOLD + 1, 2);
      const { receipt, delivery } = await publishAndReceive(payload, payload);
      expect(receipt.via).toBe('ticket');
      expect(receipt.bytes).toBe(THRESHOLD + 1);
      expect(receipt.ticket?.bytes).toBe(THRESHOLD + 1);
      expect(delivery.payload.via).toBe('ticket');
      expect(delivery.payload.bytes).toBe(THRESHOLD + 1);
    });

    it('sends a Readable of exactly threshold bytes inline', async () => {
      const payload = bytes(THRESHOLD, 3);
      const source = Readable.from([payload.subarray(0, 100), payload.subarray(100)]);
      const { receipt, delivery } = await publishAndReceive(source, payload);
      expect(receipt.via).toBe('inline');
      expect(delivery.payload.via).toBe('inline');
    });

    it('sends a Readable of threshold + 1 bytes as a ticket, the bytes read to measure it included', async () => {
      const payload = bytes(THRESHOLD + 1, 4);
      // Chunks straddle the threshold: the ones read to decide must not be lost or doubled.
      const source = Readable.from([payload.subarray(0, 700), payload.subarray(700)]);
      const { receipt, delivery } = await publishAndReceive(source, payload);
      expect(receipt.via).toBe('ticket');
      expect(receipt.ticket?.sha256).toBe(createHash('sha256').update(payload).digest('hex'));
      expect(delivery.payload.via).toBe('ticket');
    });

    it('lets one call choose its own threshold', async () => {
      const payload = bytes(11, 5);
      const receipt = await t.claimCheck.publish(t.channel, payload, {
        inlineMaxBytes: 10,
      });
      await t.transport.whenIdle();
      expect(receipt.via).toBe('ticket');
      expect(t.handler.deliveries[0].payload.via).toBe('ticket');
      expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);
    });
  });

  it('streams a 5 MiB generator source to the handler byte for byte', async () => {
    const TOTAL = 5 * 1024 * 1024;
    const CHUNK = 64 * 1024;
    const expected = createHash('sha256');
    let produced = 0;
    async function* generate(): AsyncGenerator<Buffer> {
      for (let offset = 0; offset < TOTAL; offset += CHUNK) {
        const chunk = bytes(Math.min(CHUNK, TOTAL - offset), offset + 1);
        expected.update(chunk);
        produced += chunk.length;
        yield chunk;
      }
    }
    const got = createHash('sha256');
    let received = 0;
    t.handler.read = async (payload) => {
      for await (const chunk of payload.stream()) {
        got.update(chunk as Buffer);
        received += (chunk as Buffer).length;
      }
      return Buffer.alloc(0);
    };

    const receipt = await t.claimCheck.publish(t.channel, Readable.from(generate()));
    await t.transport.whenIdle();

    const sha256 = expected.digest('hex');
    expect(produced).toBe(TOTAL);
    expect(receipt).toMatchObject({
      via: 'ticket',
      bytes: TOTAL,
      ticket: { bytes: TOTAL, sha256 },
    });
    expect(t.handler.calls).toBe(1);
    expect(t.handler.readErrors).toEqual([]);
    expect(received).toBe(TOTAL);
    expect(got.digest('hex')).toBe(sha256);
  });

  describe('what reaches the handler', () => {
    const headers = { 'x-study': 'S-1', 'x-priority': 3, 'x-urgent': true };

    it.each([
      ['inline', 10],
      ['ticket', THRESHOLD * 4],
    ])('%s: the content type and the sender’s headers, and only those', async (via, size) => {
      const payload = bytes(size, 6);
      await t.claimCheck.publish(t.channel, payload, {
        contentType: 'application/dicom',
        headers,
      });
      await t.transport.whenIdle();

      const [delivery] = t.handler.deliveries;
      expect(delivery.payload.via).toBe(via);
      expect(delivery.payload.contentType).toBe('application/dicom');
      expect(delivery.payload.headers).toEqual(headers);
      expect(delivery.bytes.equals(payload)).toBe(true);
    });

    it('the payload, not the ticket; the ticket only when the handler asks for it', async () => {
      const payload = bytes(THRESHOLD * 2, 7);
      const receipt = await t.claimCheck.publish(t.channel, payload);
      await t.transport.whenIdle();

      const [delivery] = t.handler.deliveries;
      expect(delivery.bytes.equals(payload)).toBe(true);
      expect(delivery.payload.ticket).toEqual(receipt.ticket);
      expect(delivery.payload.ticket?.ref).toEqual(expect.any(String));
    });

    it('no ticket for an inline payload', async () => {
      await t.claimCheck.publish(t.channel, Buffer.from('small'));
      await t.transport.whenIdle();
      expect(t.handler.deliveries[0].payload.ticket).toBeUndefined();
    });

    it('payload.metadata: what checkIn stored with the payload', async () => {
      const metadata = { study: 'S-1', modality: 'MR' };
      const ticket = await t.claimCheck.checkIn(bytes(100, 8), { audience: t.channel, metadata });
      await publishTicket(t.transport, t.channel, ticket);
      await t.transport.whenIdle();
      expect(t.handler.deliveries[0].payload.metadata).toEqual(metadata);
    });

    it('payload.metadata: what publish() stored with a parked payload', async () => {
      const metadata = { study: 'S-2' };
      await t.claimCheck.publish(t.channel, bytes(THRESHOLD + 1, 9), { metadata });
      await t.transport.whenIdle();
      expect(t.handler.deliveries[0].payload.metadata).toEqual(metadata);
    });
  });

  describe('the messages on the wire', () => {
    const UNCONSUMED = 'cc.unconsumed';

    it('a ticket message: x-claim-check 1, a signed ticket under 8 KiB, no payload bytes', async () => {
      const payload = Buffer.alloc(THRESHOLD * 8, 'P');
      const receipt = await t.claimCheck.publish(UNCONSUMED, payload, {
        contentType: 'application/dicom',
        headers: { 'x-study': 'S-1' },
      });

      const [message] = t.transport.peek(UNCONSUMED);
      expect(message.headers).toEqual({ 'x-claim-check': 1, 'x-study': 'S-1' });
      expect(message.body.length).toBeLessThan(MAX_TICKET_BODY_BYTES);
      expect(message.body.includes(Buffer.alloc(64, 'P'))).toBe(false);
      const ticket = JSON.parse(message.body.toString('utf8')) as Record<string, unknown>;
      expect(Object.keys(ticket).sort()).toEqual(
        [
          'audience',
          'bytes',
          'contentType',
          'expiresAt',
          'kid',
          'ref',
          'sha256',
          'sig',
          'store',
          'v',
        ].sort(),
      );
      expect(ticket.audience).toEqual([UNCONSUMED]);
      expect(ticket).toEqual({ ...receipt.ticket });
      expect(ticket).toMatchObject({
        store: 'filesystem',
        bytes: payload.length,
        sha256: createHash('sha256').update(payload).digest('hex'),
        contentType: 'application/dicom',
      });
    });

    it('an inline message: x-claim-check 0, the payload itself as the body', async () => {
      const payload = Buffer.from('inline payload');
      await t.claimCheck.publish(UNCONSUMED, payload, { contentType: 'text/plain' });

      const [message] = t.transport.peek(UNCONSUMED);
      expect(message.headers).toEqual({ 'x-claim-check': 0, 'content-type': 'text/plain' });
      expect(message.body.equals(payload)).toBe(true);
    });

    it('stores the payload before the ticket is published, and marks it published', async () => {
      const receipt = await t.claimCheck.publish(UNCONSUMED, bytes(THRESHOLD + 1, 10));
      const info = await t.store.head(receipt.ticket?.ref ?? '');
      expect(info).toMatchObject({ bytes: THRESHOLD + 1, published: true });
    });
  });
});
