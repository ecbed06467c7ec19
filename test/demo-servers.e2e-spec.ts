import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { crc32 } from 'node:zlib';
import { Redis } from 'ioredis';
import { describeWithServer, SERVERS } from '../libs/sequence/test/support/servers';
import { redisClient } from '../libs/sequence/test/support/redis.fixture';
import { syntheticStudy } from '../src/imaging/dicom-like.records';
import { DEMO_BROKERS } from './support/demo-broker';
import {
  killIfRunning,
  npmScript,
  run,
  start,
  terminate,
  type RunningProcess,
} from './support/demo-process';

const MiB = 1024 * 1024;
/** The demo's channels have fixed names: each test starts from none and leaves none behind. */
const CHANNELS = ['imaging.ai.intake', 'imaging.ai.results'];

/**
 * Study sizes per broker, and the fragments they make. Fragments are record-aware and records are
 * 512 KiB: on RabbitMQ a fragment is 8 MiB (16 records); on NATS it is what the server's
 * max_payload (1 MiB) leaves, room for one record, so the studies there are smaller.
 */
const STUDIES: Record<
  string,
  { start: [bytes: number, fragments: number]; produced: [number, number] }
> = {
  rabbitmq: { start: [20 * MiB, 3], produced: [30_000_000, 4] },
  nats: { start: [4 * MiB, 8], produced: [6_000_000, 11] },
};

function sha256Of(totalBytes: number): string {
  const hash = createHash('sha256');
  for (const record of syntheticStudy(totalBytes)) hash.update(record);
  return hash.digest('hex');
}

for (const broker of DEMO_BROKERS) {
  const studies = STUDIES[broker.transportName];
  describeWithServer(broker.server, `imaging demo ${broker.label}`, () => {
    describeWithServer('redis', 'and Redis', () => {
      const prefix = `demo-e2e-${randomUUID().slice(0, 8)}`;
      const env = {
        ...broker.env,
        REDIS_URL: SERVERS.redis.url,
        SEQUENCE_REDIS_PREFIX: prefix,
        // demo:producer and demo:consumer sign and verify claim tickets with it.
        CLAIM_CHECK_KEY: randomBytes(32).toString('base64'),
        PAYLOAD_DIR: undefined,
        CLAIM_CHECK_ABOVE_BYTES: undefined,
      };
      let redis: Redis;
      let consumer: RunningProcess | undefined;

      async function cleanUp(): Promise<void> {
        await broker.deleteChannels(CHANNELS);
        const keys = await redis.keys(`${prefix}:*`);
        if (keys.length > 0) await redis.del(...keys);
      }

      beforeAll(async () => {
        await broker.open();
        redis = redisClient();
      });

      beforeEach(cleanUp);

      afterEach(async () => {
        await killIfRunning(consumer);
        consumer = undefined;
      });

      afterAll(async () => {
        await cleanUp();
        await broker.close();
        redis.disconnect();
      });

      it('npm start sends a study and gets a matching report, leaving no fragment behind', async () => {
        const [studyBytes, fragments] = studies.start;
        const exit = await run('npm', ['start'], { ...env, STUDY_BYTES: String(studyBytes) });

        expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 0 });
        expect(exit.stdout).toContain(`${fragments} fragments, ${studyBytes} bytes`);
        expect(exit.stdout).toContain(`sha256 ${sha256Of(studyBytes)} matched`);
        // Closing let the completing delivery finish: no fragment went back to the queue.
        expect(await broker.pending('imaging.ai.intake')).toBe(0);
        // The sequence store was Redis: the completed study left its completion marker there.
        const markers = (await redis.keys(`${prefix}:*`)).filter((key) =>
          /^[^{]*:\{seq:imaging\.ai\.intake:[^}]+\}:done$/.test(key),
        );
        expect(markers).toHaveLength(1);
      });

      it('demo:consumer reports what demo:producer sent and what another program sent by the wire contract, dead-letters a corrupt fragment, and stops on SIGTERM', async () => {
        consumer = start(...npmScript('demo:consumer'), env);
        await consumer.waitForOutput('consuming imaging.ai.intake', 40_000);

        const [studyBytes, fragments] = studies.produced;
        const produced = await run(
          'npm',
          ['run', '--silent', 'demo:producer', '--', '--bytes', String(studyBytes)],
          env,
        );
        expect({ code: produced.code, stderr: produced.stderr }).toMatchObject({ code: 0 });
        // Its stdout is the receipt alone, one JSON line (logs go to stderr).
        const receipt = JSON.parse(produced.stdout.trim());
        expect(receipt).toMatchObject({
          bytes: studyBytes,
          fragments,
          sha256: sha256Of(studyBytes),
        });

        const report = JSON.parse(
          (await broker.nextMessage('imaging.ai.results', 20_000)).body.toString(),
        );
        expect(report).toMatchObject({
          sequenceId: receipt.sequenceId,
          fragments: receipt.fragments,
          bytes: receipt.bytes,
          sha256: receipt.sha256,
          status: 'ok',
        });

        // A study from "another program", by the wire contract alone: one fragment of two records.
        const study = Buffer.concat([...syntheticStudy(600_000)]);
        const foreignId = `foreign-${randomUUID()}`;
        await broker.publishForeign('imaging.ai.intake', study, {
          'x-sequence-version': 1,
          'x-sequence-id': foreignId,
          'x-sequence-position': 1,
          'x-sequence-size': 1,
          'x-sequence-last': true,
          'x-fragment-crc32': crc32(study),
          'x-sequence-bytes': study.length,
          'x-sequence-sha256': sha256Of(600_000),
          'study-uid': '1.2.840.99999.42',
        });
        const foreignReport = JSON.parse(
          (await broker.nextMessage('imaging.ai.results', 20_000)).body.toString(),
        );
        expect(foreignReport).toMatchObject({
          sequenceId: foreignId,
          studyUid: '1.2.840.99999.42',
          via: 'sequence',
          fragments: 1,
          bytes: 600_000,
          sha256: sha256Of(600_000),
          records: 2,
          status: 'ok',
        });

        // A fragment from "another program", by the wire contract, whose CRC-32 is not its body's.
        const body = Buffer.from('not the bytes the checksum was computed over');
        const sequenceId = `corrupt-${randomUUID()}`;
        await broker.publishForeign('imaging.ai.intake', body, {
          'x-sequence-version': 1,
          'x-sequence-id': sequenceId,
          'x-sequence-position': 1,
          'x-sequence-size': 1,
          'x-sequence-last': true,
          'x-fragment-crc32': crc32(Buffer.from('something else')),
          'x-sequence-bytes': body.length,
          'x-sequence-sha256': createHash('sha256').update(body).digest('hex'),
        });
        const deadLetter = await broker.nextMessage('imaging.ai.intake.dlq', 20_000);
        expect(deadLetter.body).toEqual(body);
        expect(deadLetter.headers).toMatchObject({
          'x-sequence-id': sequenceId,
          'x-death-reason': expect.stringMatching(/^crc-mismatch/),
        });

        expect(await terminate(consumer)).toMatchObject({
          code: 0,
          signal: null,
        });
      });

      it('demo:consumer takes a study above CLAIM_CHECK_ABOVE_BYTES from the Redis payload store behind a ticket, and deletes it', async () => {
        const studyBytes = 5_000_000;
        // Sent before any consumer runs: the ticket waits on the queue, the study in Redis.
        const produced = await run(
          'npm',
          ['run', '--silent', 'demo:producer', '--', '--bytes', String(studyBytes)],
          { ...env, CLAIM_CHECK_ABOVE_BYTES: String(MiB) },
        );
        expect({ code: produced.code, stderr: produced.stderr }).toMatchObject({ code: 0 });
        const receipt = JSON.parse(produced.stdout.trim().split('\n').pop()!);
        expect(receipt).toMatchObject({
          via: 'ticket',
          fragments: 1,
          bytes: studyBytes,
          sha256: sha256Of(studyBytes),
          ticket: { store: 'redis', ref: expect.any(String) },
        });
        const payloadKeys = () => redis.keys(`${prefix}:{payload*`);
        // One small message on the broker, the study's bytes in the shared store.
        expect(await broker.pending('imaging.ai.intake')).toBe(1);
        expect(await payloadKeys()).toContain(`${prefix}:{payload:${receipt.ticket.ref}}:meta`);

        consumer = start(...npmScript('demo:consumer'), env);
        const report = JSON.parse(
          (await broker.nextMessage('imaging.ai.results', 20_000)).body.toString(),
        );
        expect(report).toMatchObject({
          sequenceId: receipt.ticket.ref,
          via: 'ticket',
          fragments: 1,
          bytes: studyBytes,
          sha256: sha256Of(studyBytes),
          status: 'ok',
        });

        // The report is published from the handler; the payload goes right after, before the ack.
        const deadline = Date.now() + 10_000;
        while ((await payloadKeys()).length > 0 && Date.now() < deadline) {
          await new Promise((resolve) => setTimeout(resolve, 50));
        }
        expect(await payloadKeys()).toEqual([]);

        expect(await terminate(consumer)).toMatchObject({
          code: 0,
          signal: null,
        });
        expect(await broker.pending('imaging.ai.intake')).toBe(0);
        expect(await broker.pending('imaging.ai.intake.dlq')).toBe(0);
      });
    });
  });
}
