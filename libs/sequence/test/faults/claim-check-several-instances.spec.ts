import { bytes, eventually } from '../support/sequence-test-app';
import { sha256Hex } from '../../src/core/checksum';
import { serializeTicket } from '../../src/core/claim-ticket';
import { singleMetricValue } from './support/metrics';
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
 * "The same ticket delivered twice runs the handler once", across instances: two Nest
 * applications, each with its own RabbitMQ connection and its own Redis clients, consume one
 * queue and share one Redis claim ledger.
 */
describeOnRealServers('faults: claim check with two consumer instances on one queue', () => {
  const apps: ClaimCheckApp[] = [];
  const servers = useFaultServers({
    beforeCleanup: async () => {
      for (const app of apps.splice(0)) await app.close();
    },
  });

  it('runs the handler once in total for a ticket published 3 times, and acks all 3 messages', async () => {
    const channel = servers.admin.newChannel();
    const consumers: ClaimCheckApp[] = [];
    for (let i = 0; i < 2; i++) {
      consumers.push(
        await createClaimCheckApp({
          ...redisClaimCheckAdapters(servers.prefix),
          consume: { channel },
          backpressureDelayMs: 50,
        }),
      );
    }
    const producer = await createClaimCheckApp(redisClaimCheckAdapters(servers.prefix));
    apps.push(...consumers, producer);
    // A slow handler: the copies reach the other instance while the first is still running, so
    // the ledger's lease (not only its completion record) is what keeps them out.
    for (const consumer of consumers) {
      consumer.handler.onCall = () => new Promise((resolve) => setTimeout(resolve, 300));
    }
    const payload = bytes(300_000, 21);
    const ticket = await producer.claimCheck.checkIn(payload, { audience: channel });

    for (let copy = 0; copy < 3; copy++) {
      await producer.transport.publish(channel, serializeTicket(ticket), { 'x-claim-check': 1 });
    }

    const duplicates = async () => {
      let total = 0;
      for (const consumer of consumers) {
        total += await singleMetricValue(
          consumer.registry,
          'nest_sequence_claim_check_duplicates_total',
          { channel },
        );
      }
      return total;
    };
    const received = (consumer: ClaimCheckApp) =>
      singleMetricValue(consumer.registry, 'nest_sequence_claim_check_messages_received_total', {
        channel,
      });
    await eventually(async () => (await duplicates()) === 2, 'both copies acked as duplicates');
    // Closed, the consumers return whatever they had not acked to the queue: there is nothing.
    for (const consumer of consumers) await consumer.close();
    apps.splice(0, 2);

    const deliveries = consumers.flatMap((consumer) => consumer.handler.deliveries);
    expect(deliveries).toHaveLength(1);
    expect(deliveries[0]).toMatchObject({ via: 'ticket', sha256: sha256Hex(payload) });
    expect(consumers[0].handler.calls + consumers[1].handler.calls).toBe(1);
    // Both instances took copies: the broker handed the 3 messages out in turn.
    for (const consumer of consumers) expect(await received(consumer)).toBeGreaterThan(0);
    expect(await duplicates()).toBe(2);
    expect(await servers.admin.readyCount(channel)).toBe(0);
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
    // deleteAfter 'ack': the one completion deleted the payload.
    expect(
      (await keysUnder(servers.redis, servers.prefix)).filter((key) =>
        key.includes(`{payload:${ticket.ref}}`),
      ),
    ).toEqual([]);
  });
});
