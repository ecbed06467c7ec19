import { ClaimTicketKeyring } from 'nest-sequence/wire';
import { sha256Hex } from '../../src/core/checksum';
import { serializeTicket, ticketSigningInput, type ClaimTicket } from '../../src/core/claim-ticket';
import { bytes, eventually } from '../support/sequence-test-app';
import { keysUnder } from '../support/redis.fixture';
import {
  createClaimCheckApp,
  redisClaimCheckAdapters,
  SIGNING_KEYS,
  type ClaimCheckApp,
} from './support/claim-check.app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';

jest.setTimeout(30_000);

/**
 * Tickets bound to their channel, over RabbitMQ with the Redis payload store and claim ledger: a
 * ticket taken off the queue it was published to and published onto another queue is
 * dead-lettered `wrong-audience` there, and neither its payload nor the ledger is touched.
 */
describeOnRealServers('faults: a claim ticket replayed onto another queue', () => {
  const apps: ClaimCheckApp[] = [];
  const servers = useFaultServers({
    beforeCleanup: async () => {
      for (const app of apps.splice(0)) await app.close();
    },
  });

  async function appsOn(
    channel: string,
    acceptTicketsWithoutAudience?: boolean,
  ): Promise<{ consumer: ClaimCheckApp; producer: ClaimCheckApp }> {
    // The consumer first: it declares the queue (and its .dlq) before anything is published.
    const consumer = await createClaimCheckApp({
      ...redisClaimCheckAdapters(servers.prefix),
      consume: { channel },
      acceptTicketsWithoutAudience,
    });
    apps.push(consumer);
    const producer = await createClaimCheckApp(redisClaimCheckAdapters(servers.prefix));
    apps.push(producer);
    return { consumer, producer };
  }

  const payloadKeys = async (ref: string) =>
    (await keysUnder(servers.redis, servers.prefix)).filter((key) =>
      key.includes(`{payload:${ref}}`),
    );
  const ledgerKeys = async () =>
    (await keysUnder(servers.redis, servers.prefix)).filter((key) => key.includes('{claim:'));

  async function deadLetterOf(channel: string): Promise<{ body: Buffer; reason: string }> {
    await eventually(
      async () => (await servers.admin.readyCount(`${channel}.dlq`)) === 1,
      'the ticket dead-lettered',
    );
    const [dead] = await servers.admin.drain(`${channel}.dlq`);
    return { body: dead.body, reason: String(dead.headers['x-death-reason']) };
  }

  it('dead-letters a ticket published for one queue and replayed onto another wrong-audience; its payload and the ledger are untouched', async () => {
    const [issuedFor, replayedOn] = [servers.admin.newChannel(), servers.admin.newChannel()];
    const { consumer, producer } = await appsOn(replayedOn);
    const payload = bytes(300_000, 51);
    const receipt = await producer.claimCheck.publish(issuedFor, payload);
    expect(receipt.via).toBe('ticket');
    const replayed = serializeTicket(receipt.ticket!);

    await producer.transport.publish(replayedOn, replayed, { 'x-claim-check': 1 });
    const dead = await deadLetterOf(replayedOn);

    expect(dead.body.equals(replayed)).toBe(true);
    expect(dead.reason).toMatch(
      new RegExp(`^wrong-audience: claim ticket redis:\\S+ was issued for "${issuedFor}"`),
    );
    expect(consumer.handler.calls).toBe(0);
    expect(await servers.admin.readyCount(replayedOn)).toBe(0);
    expect(await payloadKeys(receipt.ticket!.ref)).not.toEqual([]);
    expect(await ledgerKeys()).toEqual([]);
    // Still there, unharmed, for the consumers of the queue it was issued for.
    expect(await servers.admin.readyCount(issuedFor)).toBe(1);
    const claimed = await producer.claimCheck.checkOut(receipt.ticket);
    expect(sha256Hex(await claimed.toBuffer())).toBe(sha256Hex(payload));
  });

  it('dead-letters a ticket whose audience was rewritten bad-signature, touching nothing', async () => {
    const channel = servers.admin.newChannel();
    const { consumer, producer } = await appsOn(channel);
    const ticket = await producer.claimCheck.checkIn(bytes(300_000, 52), { audience: 'other' });

    await producer.transport.publish(
      channel,
      Buffer.from(JSON.stringify({ ...ticket, audience: [channel] })),
      { 'x-claim-check': 1 },
    );
    const dead = await deadLetterOf(channel);

    expect(dead.reason).toMatch(/^claim-ticket-invalid: claim ticket refused \(bad-signature\)/);
    expect(consumer.handler.calls).toBe(0);
    expect(await payloadKeys(ticket.ref)).not.toEqual([]);
    expect(await ledgerKeys()).toEqual([]);
  });

  describe('a ticket without an audience (v 1, from an earlier release)', () => {
    /** The ticket as such a release wrote it, signed with the keys every app here shares. */
    function legacyTicket(genuine: ClaimTicket): Buffer {
      const { audience: _audience, sig: _sig, ...fields } = genuine;
      const unsigned = { ...fields, v: 1 as const };
      const keys = new ClaimTicketKeyring(SIGNING_KEYS);
      const sig = keys.hmac(unsigned.kid, ticketSigningInput(unsigned))!.toString('base64url');
      return Buffer.from(JSON.stringify({ ...unsigned, sig }));
    }

    it('is dead-lettered claim-ticket-invalid (no-audience) by default, touching nothing', async () => {
      const channel = servers.admin.newChannel();
      const { consumer, producer } = await appsOn(channel);
      const ticket = await producer.claimCheck.checkIn(bytes(300_000, 53), { audience: channel });

      await producer.transport.publish(channel, legacyTicket(ticket), { 'x-claim-check': 1 });
      const dead = await deadLetterOf(channel);

      expect(dead.reason).toMatch(/^claim-ticket-invalid: claim ticket refused \(no-audience\)/);
      expect(consumer.handler.calls).toBe(0);
      expect(await payloadKeys(ticket.ref)).not.toEqual([]);
      expect(await ledgerKeys()).toEqual([]);
    });

    it('is handled while the consumer accepts tickets without audience', async () => {
      const channel = servers.admin.newChannel();
      const { consumer, producer } = await appsOn(channel, true);
      const payload = bytes(300_000, 54);
      const ticket = await producer.claimCheck.checkIn(payload, { audience: channel });

      await producer.transport.publish(channel, legacyTicket(ticket), { 'x-claim-check': 1 });
      await eventually(() => consumer.handler.deliveries.length === 1, 'the ticket handled');

      expect(consumer.handler.deliveries[0]).toMatchObject({
        via: 'ticket',
        sha256: sha256Hex(payload),
        ticket: { v: 1 },
      });
      expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
    });
  });
});
