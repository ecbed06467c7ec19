import { createHash } from 'node:crypto';
import { bytes, eventually } from '../support/sequence-test-app';
import {
  createClaimCheckApp,
  generatedPayload,
  redisClaimCheckAdapters,
  type ClaimCheckApp,
} from './support/claim-check.app';
import { useFaultServersOn } from './support/fault-servers';
import { keysUnder } from '../support/redis.fixture';
import { describeOnTransports } from '../support/transports.fixture';

jest.setTimeout(30_000);

const MIB = 1024 * 1024;

/**
 * Claim Check end to end on the real servers: `ClaimCheckService.publish` in one Nest application
 * (the broker, Redis payload store, Redis claim ledger), a `@ClaimCheck` handler with the default
 * retention (`deleteAfter: 'ack'`) in another.
 */
describeOnTransports('faults: claim check round trip with Redis', ['redis'], (on) => {
  let channel: string;
  const apps: ClaimCheckApp[] = [];
  const servers = useFaultServersOn(on, {
    beforeCleanup: async () => {
      for (const app of apps.splice(0)) await app.close();
    },
  });

  beforeEach(async () => {
    channel = servers.admin.newChannel();
    // Consumer first: it declares the channel, and receives in another application than the
    // sender.
    apps.push(
      await createClaimCheckApp({
        ...redisClaimCheckAdapters(servers.prefix),
        consume: { channel },
        on,
      }),
      await createClaimCheckApp({ ...redisClaimCheckAdapters(servers.prefix), on }),
    );
  });

  const payloadKeys = async () =>
    (await keysUnder(servers.redis, servers.prefix)).filter((key) => key.includes(':{payload:'));

  it('sends a payload under the threshold inline: the handler gets its exact bytes once, and nothing is parked in Redis', async () => {
    const [consumer, producer] = apps;
    const payload = bytes(10_000, 3);

    const receipt = await producer.claimCheck.publish(channel, payload, {
      contentType: 'application/octet-stream',
      headers: { 'x-study': 'inline-1' },
    });

    expect(receipt).toMatchObject({ channel, via: 'inline', bytes: payload.length });
    await eventually(() => consumer.handler.deliveries.length === 1, 'the delivery');
    await eventually(
      async () => (await servers.admin.readyCount(channel)) === 0,
      'the channel drained',
    );
    expect(consumer.handler.deliveries).toEqual([
      {
        via: 'inline',
        bytes: payload.length,
        sha256: createHash('sha256').update(payload).digest('hex'),
        headers: { 'x-study': 'inline-1' },
        ticket: undefined,
      },
    ]);
    expect(await payloadKeys()).toEqual([]);
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
  });

  it('parks a 20 MiB stream in Redis behind a ticket: the handler reads the exact bytes once, and the payload keys are gone once it is acked', async () => {
    const [consumer, producer] = apps;
    const payload = generatedPayload(20 * MIB, 4);
    let parkedKeys: string[] = [];
    // Seen while the handler runs: the payload is in Redis, chunked, until the handler succeeded.
    consumer.handler.onCall = async () => {
      parkedKeys = await payloadKeys();
    };

    const receipt = await producer.claimCheck.publish(channel, payload.stream(), {
      headers: { 'x-study': 'streamed-1' },
    });

    expect(receipt).toMatchObject({ channel, via: 'ticket', bytes: payload.bytes });
    expect(receipt.ticket).toMatchObject({ store: 'redis', bytes: payload.bytes });
    expect(receipt.ticket?.sha256).toBe(payload.sha256);
    await eventually(() => consumer.handler.deliveries.length === 1, 'the delivery', 20_000);
    await eventually(async () => (await payloadKeys()).length === 0, 'the payload deleted');
    await eventually(
      async () => (await servers.admin.readyCount(channel)) === 0,
      'the channel drained',
    );
    // Closed, the consumer returns whatever it had not acked to the channel: there is nothing.
    await consumer.close();
    apps.splice(apps.indexOf(consumer), 1);

    expect(consumer.handler.calls).toBe(1);
    expect(consumer.handler.deliveries[0]).toMatchObject({
      via: 'ticket',
      bytes: payload.bytes,
      sha256: payload.sha256,
      headers: { 'x-study': 'streamed-1' },
      ticket: receipt.ticket,
    });
    // A meta hash and 20 chunks of 1 MiB (the store's default chunk size).
    expect(parkedKeys).toHaveLength(21);
    expect(parkedKeys.every((key) => key.includes(`{payload:${receipt.ticket!.ref}}`))).toBe(true);
    expect(await servers.admin.readyCount(channel)).toBe(0);
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
  });
});
