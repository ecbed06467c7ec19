import { randomUUID } from 'node:crypto';
import { CreateBucketCommand, ListObjectsV2Command, S3Client } from '@aws-sdk/client-s3';
import { RedisClaimLedger } from 'nest-sequence/redis';
import { S3PayloadStore } from 'nest-sequence/s3';
import { SERVERS } from '../support/servers';
import { eventually } from '../support/sequence-test-app';
import { S3RVER_CREDENTIALS, startS3rver, type S3rverProcess } from '../support/processes/s3rver';
import {
  createClaimCheckApp,
  generatedPayload,
  type ClaimCheckApp,
} from './support/claim-check.app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';

jest.setTimeout(30_000);

const MIB = 1024 * 1024;
const BUCKET = 'nseq-claim-check';

/**
 * Claim Check end to end with the S3 payload store, against a real S3-compatible server on
 * loopback (s3rver, see test/support/s3rver.ts), RabbitMQ for the ticket and the Redis claim
 * ledger.
 */
describeOnRealServers('faults: claim check round trip with the S3 payload store', () => {
  let s3rver: S3rverProcess;
  let client: S3Client;
  const apps: ClaimCheckApp[] = [];
  const servers = useFaultServers({
    beforeCleanup: async () => {
      for (const app of apps.splice(0)) await app.close();
    },
  });

  beforeAll(async () => {
    s3rver = await startS3rver();
    client = new S3Client({
      endpoint: s3rver.endpoint,
      region: 'us-east-1',
      forcePathStyle: true,
      credentials: S3RVER_CREDENTIALS,
    });
    await client.send(new CreateBucketCommand({ Bucket: BUCKET }));
  });

  afterAll(async () => {
    client?.destroy();
    await s3rver?.stop();
  });

  it('parks a 12 MiB stream in S3 (a multipart upload), delivers its exact bytes once through RabbitMQ, and deletes the object once acked', async () => {
    const channel = servers.admin.newChannel();
    const s3Prefix = `faults/${randomUUID()}/`;
    const adapters = () => ({
      store: S3PayloadStore.connect({
        endpoint: s3rver.endpoint,
        region: 'us-east-1',
        forcePathStyle: true,
        credentials: S3RVER_CREDENTIALS,
        bucket: BUCKET,
        prefix: s3Prefix,
        partBytes: 5 * MIB,
      }),
      ledger: RedisClaimLedger.connect(SERVERS.redis.url, { prefix: servers.prefix }),
    });
    const consumer = await createClaimCheckApp({ ...adapters(), consume: { channel } });
    apps.push(consumer);
    const producer = await createClaimCheckApp(adapters());
    apps.push(producer);
    const objects = async () =>
      (
        (await client.send(new ListObjectsV2Command({ Bucket: BUCKET, Prefix: s3Prefix })))
          .Contents ?? []
      ).map((object) => ({ key: object.Key!, bytes: object.Size }));
    const payload = generatedPayload(12 * MIB, 71);
    let parked: Array<{ key: string; bytes?: number }> = [];
    consumer.handler.onCall = async () => {
      parked = await objects();
    };

    const receipt = await producer.claimCheck.publish(channel, payload.stream(), {
      contentType: 'application/dicom',
    });

    expect(receipt).toMatchObject({ channel, via: 'ticket', bytes: payload.bytes });
    expect(receipt.ticket).toMatchObject({ store: 's3', sha256: payload.sha256 });
    await eventually(() => consumer.handler.deliveries.length === 1, 'the delivery', 20_000);
    await eventually(async () => (await objects()).length === 0, 'the object deleted');
    await eventually(
      async () => (await servers.admin.readyCount(channel)) === 0,
      'the queue drained',
    );
    await new Promise((resolve) => setTimeout(resolve, 200));

    // (Next to it, maybe, the empty marker saying that its ticket was published: the producer
    // writes that after the confirm, so the handler may or may not start before it.)
    expect(parked.filter(({ key }) => key.startsWith(`${s3Prefix}payloads/`))).toEqual([
      { key: `${s3Prefix}payloads/${receipt.ticket!.ref}`, bytes: payload.bytes },
    ]);
    expect(consumer.handler.calls).toBe(1);
    expect(consumer.handler.deliveries[0]).toMatchObject({
      via: 'ticket',
      bytes: payload.bytes,
      sha256: payload.sha256,
      ticket: receipt.ticket,
    });
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
  });
});
