import { ClaimCheckNotFoundError } from 'nest-sequence';
import { bytes, eventually } from '../support/sequence-test-app';
import { sha256Hex } from '../../src/core/checksum';
import { serializeTicket, signTicket } from '../../src/core/claim-ticket';
import { ClaimTicketKeyring } from '../../src/core/claim-ticket-keyring';
import {
  createClaimCheckApp,
  redisClaimCheckAdapters,
  SIGNING_KEYS,
  type ClaimCheckApp,
} from './support/claim-check.app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';
import { keysUnder } from '../support/redis.fixture';

jest.setTimeout(30_000);

/**
 * Retention `deleteAfter: { consumers: N }`, reference counting for fan-out: one ticket sent to
 * two queues (two consumer groups, each a Nest application of its own), counted in the shared
 * Redis claim ledger.
 */
describeOnRealServers('faults: claim check fan-out to two queues with reference counting', () => {
  const apps: ClaimCheckApp[] = [];
  const servers = useFaultServers({
    beforeCleanup: async () => {
      for (const app of apps.splice(0)) await app.close();
    },
  });

  it('keeps the payload after the first of 2 groups handled it, and deletes it after the second', async () => {
    const [billing, archive] = [servers.admin.newChannel(), servers.admin.newChannel()];
    const retention = { deleteAfter: { consumers: 2 } } as const;
    const billingApp = await createClaimCheckApp({
      ...redisClaimCheckAdapters(servers.prefix),
      consume: { channel: billing, ...retention },
    });
    apps.push(billingApp);
    const producer = await createClaimCheckApp(redisClaimCheckAdapters(servers.prefix));
    apps.push(producer);
    const payload = bytes(400_000, 31);
    const payloadKeys = async (ref: string) =>
      (await keysUnder(servers.redis, servers.prefix)).filter((key) =>
        key.includes(`{payload:${ref}}`),
      );

    // One ticket issued for both channels. The archive group is not running yet: its queue
    // (declared by the publish) keeps the ticket.
    const ticket = await producer.claimCheck.checkIn(payload, { audience: [billing, archive] });
    for (const channel of [billing, archive]) {
      await producer.transport.publish(channel, serializeTicket(ticket), { 'x-claim-check': 1 });
    }

    await eventually(
      () => billingApp.handler.deliveries.length === 1,
      'the first group handled it',
    );
    await eventually(
      async () => (await servers.admin.readyCount(billing)) === 0,
      'its queue drained',
    );
    expect(billingApp.handler.deliveries[0].sha256).toBe(sha256Hex(payload));
    expect(await payloadKeys(ticket.ref)).not.toEqual([]);
    const stillThere = await producer.claimCheck.checkOut(ticket);
    expect(sha256Hex(await stillThere.toBuffer())).toBe(sha256Hex(payload));
    expect(await servers.admin.readyCount(archive)).toBe(1);

    const archiveApp = await createClaimCheckApp({
      ...redisClaimCheckAdapters(servers.prefix),
      consume: { channel: archive, ...retention },
    });
    apps.push(archiveApp);
    await eventually(() => archiveApp.handler.deliveries.length === 1, 'the second group');
    await eventually(async () => (await payloadKeys(ticket.ref)).length === 0, 'the payload gone');

    expect(archiveApp.handler.deliveries[0].sha256).toBe(sha256Hex(payload));
    await expect(producer.claimCheck.checkOut(ticket)).rejects.toBeInstanceOf(
      ClaimCheckNotFoundError,
    );
    expect(billingApp.handler.calls).toBe(1);
    expect(archiveApp.handler.calls).toBe(1);
    for (const queue of [billing, archive]) {
      expect(await servers.admin.readyCount(`${queue}.dlq`)).toBe(0);
    }
  });

  it('keeps a payload its producer never marked published for the group still to come, past orphanGraceMs', async () => {
    const [billing, archive] = [servers.admin.newChannel(), servers.admin.newChannel()];
    const retention = { deleteAfter: { consumers: 2 } } as const;
    const billingApp = await createClaimCheckApp({
      ...redisClaimCheckAdapters(servers.prefix),
      consume: { channel: billing, ...retention },
    });
    apps.push(billingApp);
    const payload = bytes(400_000, 32);
    const payloadKeys = async (ref: string) =>
      (await keysUnder(servers.redis, servers.prefix)).filter((key) =>
        key.includes(`{payload:${ref}}`),
      );

    // What publish() leaves when its process dies between the broker's confirm and the mark:
    // the payload stored unpublished, its ticket in both queues.
    const { store, ledger } = redisClaimCheckAdapters(servers.prefix);
    const now = Date.now();
    const expiresAt = now + 24 * 3_600_000;
    let ref: string;
    try {
      ({ ref } = await store.put(payload, { now, expiresAt, published: false }));
    } finally {
      await store.close();
      await ledger.close();
    }
    const ticket = signTicket(
      {
        store: store.name,
        ref,
        bytes: payload.length,
        sha256: sha256Hex(payload),
        expiresAt,
        audience: [billing, archive],
      },
      new ClaimTicketKeyring(SIGNING_KEYS),
    );
    for (const channel of [billing, archive]) {
      await billingApp.transport.publish(channel, serializeTicket(ticket), { 'x-claim-check': 1 });
    }
    await eventually(
      () => billingApp.handler.deliveries.length === 1,
      'the first group handled it',
    );

    // The archive group lags behind by more than orphanGraceMs; a sweep runs meanwhile.
    const later = Date.now() + 2 * 3_600_000;
    expect(await billingApp.sweeper.sweep(later)).toEqual({ expired: 0, orphaned: 0 });
    expect(await payloadKeys(ticket.ref)).not.toEqual([]);

    const archiveApp = await createClaimCheckApp({
      ...redisClaimCheckAdapters(servers.prefix),
      consume: { channel: archive, ...retention },
    });
    apps.push(archiveApp);
    await eventually(() => archiveApp.handler.deliveries.length === 1, 'the second group');
    await eventually(async () => (await payloadKeys(ticket.ref)).length === 0, 'the payload gone');
    expect(archiveApp.handler.deliveries[0].sha256).toBe(sha256Hex(payload));
    for (const queue of [billing, archive]) {
      expect(await servers.admin.readyCount(`${queue}.dlq`)).toBe(0);
    }
  });
});
