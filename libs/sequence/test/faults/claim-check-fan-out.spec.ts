import { Redis } from 'ioredis';
import { ClaimCheckNotFoundError } from 'nest-sequence';
import { SERVERS } from '../support/servers';
import { bytes, eventually } from '../support/sequence-test-app';
import { sha256Hex } from '../../src/core/checksum';
import { serializeTicket } from '../../src/core/claim-ticket';
import {
  createClaimCheckApp,
  redisClaimCheckAdapters,
  type ClaimCheckApp,
} from './support/claim-check.app';
import { RabbitMqAdmin } from './support/rabbitmq.admin';
import { describeOnRealServers } from './support/real-servers';
import { deleteUnder, keysUnder, newPrefix } from './support/redis.admin';

jest.setTimeout(30_000);

/**
 * Retention `deleteAfter: { consumers: N }`, reference counting for fan-out: one ticket sent to
 * two queues (two consumer groups, each a Nest application of its own), counted in the shared
 * Redis claim ledger.
 */
describeOnRealServers('faults: claim check fan-out to two queues with reference counting', () => {
  let admin: RabbitMqAdmin;
  let redis: Redis;
  let prefix: string;
  const apps: ClaimCheckApp[] = [];

  beforeAll(async () => {
    admin = await RabbitMqAdmin.connect();
    redis = new Redis(SERVERS.redis.url);
  });

  afterEach(async () => {
    for (const app of apps.splice(0)) await app.close();
    await admin.cleanup();
    await deleteUnder(redis, prefix);
  });

  afterAll(async () => {
    await admin.close();
    await redis.quit();
  });

  it('keeps the payload after the first of 2 groups handled it, and deletes it after the second', async () => {
    const [billing, archive] = [admin.newChannel(), admin.newChannel()];
    prefix = newPrefix();
    const retention = { deleteAfter: { consumers: 2 } } as const;
    const billingApp = await createClaimCheckApp({
      ...redisClaimCheckAdapters(prefix),
      consume: { channel: billing, ...retention },
    });
    apps.push(billingApp);
    const producer = await createClaimCheckApp(redisClaimCheckAdapters(prefix));
    apps.push(producer);
    const payload = bytes(400_000, 31);
    const payloadKeys = async (ref: string) =>
      (await keysUnder(redis, prefix)).filter((key) => key.includes(`{payload:${ref}}`));

    // The archive group is not running yet: its queue (declared by the publish) keeps the ticket.
    const { ticket } = await producer.claimCheck.publish(billing, payload);
    await producer.transport.publish(archive, serializeTicket(ticket!), { 'x-claim-check': 1 });

    await eventually(
      () => billingApp.handler.deliveries.length === 1,
      'the first group handled it',
    );
    await eventually(async () => (await admin.readyCount(billing)) === 0, 'its queue drained');
    expect(billingApp.handler.deliveries[0].sha256).toBe(sha256Hex(payload));
    expect(await payloadKeys(ticket!.ref)).not.toEqual([]);
    const stillThere = await producer.claimCheck.checkOut(ticket);
    expect(sha256Hex(await stillThere.toBuffer())).toBe(sha256Hex(payload));
    expect(await admin.readyCount(archive)).toBe(1);

    const archiveApp = await createClaimCheckApp({
      ...redisClaimCheckAdapters(prefix),
      consume: { channel: archive, ...retention },
    });
    apps.push(archiveApp);
    await eventually(() => archiveApp.handler.deliveries.length === 1, 'the second group');
    await eventually(async () => (await payloadKeys(ticket!.ref)).length === 0, 'the payload gone');

    expect(archiveApp.handler.deliveries[0].sha256).toBe(sha256Hex(payload));
    await expect(producer.claimCheck.checkOut(ticket)).rejects.toBeInstanceOf(
      ClaimCheckNotFoundError,
    );
    expect(billingApp.handler.calls).toBe(1);
    expect(archiveApp.handler.calls).toBe(1);
    for (const queue of [billing, archive]) {
      expect(await admin.readyCount(`${queue}.dlq`)).toBe(0);
    }
  });
});
