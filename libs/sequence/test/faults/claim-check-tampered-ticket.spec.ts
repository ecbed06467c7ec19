import { bytes, eventually } from '../support/sequence-test-app';
import { sha256Hex } from '../../src/core/checksum';
import {
  createClaimCheckApp,
  redisClaimCheckAdapters,
  type ClaimCheckApp,
} from './support/claim-check.app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';
import { keysUnder } from '../support/redis.fixture';

jest.setTimeout(30_000);

/**
 * A ticket altered on its way, fed by a program that is not this library (plain amqplib on a
 * confirm channel, straight to the consumer's queue): refused, dead-lettered with the reason, and
 * never able to reach or delete the payload it was altered to name.
 */
describeOnRealServers('faults: a tampered claim ticket published straight to the queue', () => {
  const apps: ClaimCheckApp[] = [];
  const servers = useFaultServers({
    beforeCleanup: async () => {
      for (const app of apps.splice(0)) await app.close();
    },
  });

  it('dead-letters the tampered ticket with claim-ticket-invalid and its headers, leaves the payload it names alone, and delivers the valid ticket behind it', async () => {
    const channel = servers.admin.newChannel();
    // Declares the queue (and its .dlq) before anything is published to it.
    const consumer = await createClaimCheckApp({
      ...redisClaimCheckAdapters(servers.prefix),
      consume: { channel },
    });
    const producer = await createClaimCheckApp(redisClaimCheckAdapters(servers.prefix));
    apps.push(consumer, producer);
    const mine = bytes(300_000, 41);
    const theirs = bytes(300_000, 42);
    const myTicket = await producer.claimCheck.checkIn(mine, { audience: channel });
    const theirTicket = await producer.claimCheck.checkIn(theirs, { audience: channel });
    // Someone holding a ticket of their own rewrites it to name another payload, keeping the
    // signature, hoping to read (and, with deleteAfter 'ack', delete) it.
    const tampered = Buffer.from(
      JSON.stringify({ ...myTicket, ref: theirTicket.ref, sha256: theirTicket.sha256 }),
    );
    const valid = Buffer.from(JSON.stringify(theirTicket));
    const headers = { 'x-claim-check': 1, 'x-sender': 'amqplib' };

    const publisher = await servers.admin.confirmChannel();
    try {
      publisher.sendToQueue(channel, tampered, { headers, persistent: true });
      publisher.sendToQueue(channel, valid, { headers, persistent: true });
      await publisher.waitForConfirms();
    } finally {
      await publisher.close();
    }

    await eventually(() => consumer.handler.deliveries.length === 1, 'the valid ticket delivered');
    await eventually(
      async () => (await servers.admin.readyCount(`${channel}.dlq`)) === 1,
      'the tampered ticket dead-lettered',
    );
    await eventually(
      async () => (await servers.admin.readyCount(channel)) === 0,
      'the queue drained',
    );

    expect(consumer.handler.calls).toBe(1);
    expect(consumer.handler.deliveries[0]).toMatchObject({
      via: 'ticket',
      sha256: sha256Hex(theirs),
      headers: { 'x-sender': 'amqplib' },
    });
    const [dead] = await servers.admin.drain(`${channel}.dlq`);
    expect(dead.body.equals(tampered)).toBe(true);
    expect(dead.headers).toEqual({
      ...headers,
      'x-death-reason': expect.stringMatching(
        /^claim-ticket-invalid: claim ticket refused \(bad-signature\): /,
      ) as string,
    });
    // The payload the tampered ticket named was not deleted by it: the valid ticket read it
    // (and only then, deleteAfter 'ack', deleted it); the tamperer's own payload is untouched.
    const left = await keysUnder(servers.redis, servers.prefix);
    expect(left.filter((key) => key.includes(`{payload:${myTicket.ref}}`))).not.toEqual([]);
    expect(left.filter((key) => key.includes(`{payload:${theirTicket.ref}}`))).toEqual([]);
  });
});
