import { createHash, randomUUID } from 'node:crypto';
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { jetstreamManager } from '@nats-io/jetstream';
import { Redis } from 'ioredis';
import { connectNats } from '../libs/sequence/src/adapters/transports/nats/nats.client';
import { streamName } from '../libs/sequence/src/adapters/transports/nats/nats.naming';
import { amqpConnection } from '../libs/sequence/test/support/rabbitmq.fixture';
import { redisClient } from '../libs/sequence/test/support/redis.fixture';
import { describeWithServer, SERVERS } from '../libs/sequence/test/support/servers';
import { syntheticStudy } from '../src/imaging/dicom-like.records';
import { npmScript, run, type Exit } from './support/demo-process';

const MiB = 1024 * 1024;
/** A few MiB: 6 records of 512 KiB. */
const STUDY_BYTES = 3 * MiB;
/** The embedded defaults and a small study, whatever the environment of the test run says. */
const NO_SERVERS = {
  AMQP_URL: undefined,
  NATS_URL: undefined,
  REDIS_URL: undefined,
  PAYLOAD_DIR: undefined,
  CLAIM_CHECK_ABOVE_BYTES: undefined,
  CLAIM_CHECK_KEY: undefined,
  STUDY_BYTES: String(STUDY_BYTES),
};
/** The channel's queues or streams the demo makes on a broker, with their dead-letter ones. */
const CHANNELS = ['imaging.ai.intake', 'imaging.ai.intake.dlq', 'imaging.ai.intake.dlq.dlq'];

function sha256Of(totalBytes: number): string {
  const hash = createHash('sha256');
  for (const record of syntheticStudy(totalBytes)) hash.update(record);
  return hash.digest('hex');
}

const demo = (env: NodeJS.ProcessEnv, ...args: string[]) =>
  run(...npmScript('demo:microservice', ...args), env);

/**
 * The run verified the study (the SHA-256 the handler computed as it streamed is the sender's)
 * and, given `--invalid`, showed the study with bad metadata dead-lettered with the
 * ValidationPipe's messages.
 */
function expectVerified(
  exit: Exit,
  expected: { transport: string; fragments: number; via?: string },
) {
  // stderr rides along so that a failure shows why the demo exited.
  expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 0 });
  const fragments = `${expected.fragments} fragment${expected.fragments === 1 ? '' : 's'}`;
  expect(exit.stdout).toMatch(
    new RegExp(
      `study 1\\.2\\.840\\.99999\\.\\d+ \\(CT\\): ${fragments}, ${STUDY_BYTES} bytes, ` +
        `via ${expected.via ?? 'sequence'}, on the ${expected.transport} transport`,
    ),
  );
  expect(exit.stdout).toContain(
    "x-study validated; 6 records streamed through @EventPattern('imaging.ai.intake')",
  );
  expect(exit.stdout).toContain(`sha256 ${sha256Of(STUDY_BYTES)} matched`);
}

function expectDeadLettered(exit: Exit) {
  expect(exit.stdout).toMatch(
    /study with x-study \{"studyUid":"study-\d+","modality":"XR","bytes":1048576\}: refused before the handler ran\n {2}dead-lettered to imaging\.ai\.intake\.dlq: invalid-payload: .*studyUid must be a DICOM UID; modality must be one of the following values: CT, MR, PT, CR, DX, MG, US/,
  );
}

describe('microservice demo on the embedded defaults', () => {
  it('streams a study to an @EventPattern handler, verifies its SHA-256, and dead-letters one with invalid metadata', async () => {
    const exit = await demo(NO_SERVERS, '--invalid');

    expectVerified(exit, { transport: 'in-memory', fragments: 1 });
    expectDeadLettered(exit);
  });

  describe('with a study above CLAIM_CHECK_ABOVE_BYTES', () => {
    let payloadDir: string;

    beforeEach(async () => {
      payloadDir = await mkdtemp(join(tmpdir(), 'microservice-e2e-payloads-'));
    });

    afterEach(async () => {
      await rm(payloadDir, { recursive: true, force: true });
    });

    it('emits it behind a claim ticket, streams it from the payload store, and deletes it', async () => {
      const exit = await demo({
        ...NO_SERVERS,
        CLAIM_CHECK_ABOVE_BYTES: String(MiB),
        PAYLOAD_DIR: payloadDir,
      });

      expectVerified(exit, { transport: 'in-memory', fragments: 1, via: 'ticket' });
      // The store made its day directories under the root (it was used), and no file is left.
      expect((await readdir(payloadDir)).length).toBeGreaterThan(0);
      const entries = await readdir(payloadDir, { recursive: true, withFileTypes: true });
      expect(entries.filter((entry) => !entry.isDirectory()).map((entry) => entry.name)).toEqual(
        [],
      );
    });
  });

  it('refuses NATS_URL and AMQP_URL together with a usage error, before connecting', async () => {
    const exit = await demo({
      ...NO_SERVERS,
      // Nothing listens there: a connection attempt would fail with another message.
      NATS_URL: 'nats://127.0.0.1:1',
      AMQP_URL: 'amqp://guest:guest@127.0.0.1:1',
    });

    expect(exit.code).toBe(2);
    expect(exit.stderr).toContain('AMQP_URL and NATS_URL are both set');
  });
});

describeWithServer('rabbitmq', 'microservice demo on RabbitMQ', () => {
  describeWithServer('redis', 'and Redis', () => {
    const prefix = `microservice-e2e-${randomUUID().slice(0, 8)}`;

    async function cleanUp(): Promise<void> {
      const connection = await amqpConnection();
      const channel = await connection.createChannel();
      for (const queue of CHANNELS) await channel.deleteQueue(queue);
      await connection.close();
      const redis: Redis = redisClient();
      const keys = await redis.keys(`${prefix}:*`);
      if (keys.length > 0) await redis.del(...keys);
      redis.disconnect();
    }

    beforeEach(cleanUp);
    afterAll(cleanUp);

    it('streams a study to an @EventPattern handler, verifies its SHA-256, and dead-letters one with invalid metadata', async () => {
      const exit = await demo(
        {
          ...NO_SERVERS,
          AMQP_URL: SERVERS.rabbitmq.url,
          REDIS_URL: SERVERS.redis.url,
          SEQUENCE_REDIS_PREFIX: prefix,
        },
        '--invalid',
      );

      expectVerified(exit, { transport: 'rabbitmq', fragments: 1 });
      expectDeadLettered(exit);
    });
  });
});

describeWithServer('nats', 'microservice demo on NATS JetStream', () => {
  async function cleanUp(): Promise<void> {
    const admin = await connectNats({ servers: SERVERS.nats.url });
    const jsm = await jetstreamManager(admin);
    for (const channel of CHANNELS) {
      await jsm.streams.delete(streamName('NSEQ_', channel)).catch(() => undefined);
    }
    await admin.close();
  }

  beforeEach(cleanUp);
  afterAll(cleanUp);

  it('streams a study in fragments within max_payload, verifies its SHA-256, and dead-letters one with invalid metadata', async () => {
    const exit = await demo({ ...NO_SERVERS, NATS_URL: SERVERS.nats.url }, '--invalid');

    // max_payload is 1 MiB: one 512 KiB record per fragment (two would not fit with the headers).
    expectVerified(exit, { transport: 'nats', fragments: 6 });
    expectDeadLettered(exit);
  });
});
