import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { crc32 } from 'node:zlib';
import * as amqplib from 'amqplib';
import { Redis } from 'ioredis';
import { describeWithServer, SERVERS } from '../libs/sequence/test/support/servers';
import { amqpConnection } from '../libs/sequence/test/support/rabbitmq.fixture';
import { redisClient } from '../libs/sequence/test/support/redis.fixture';
import { syntheticStudy } from '../src/imaging/dicom-like.records';
import { npmScript, run, start, type RunningProcess } from './support/demo-process';

const MiB = 1024 * 1024;
/**
 * The demo's queues have fixed names: each test starts from none and leaves none behind. The
 * transport declares every queue it publishes to with a dead-letter queue of its own, so a
 * dead-lettered fragment also brings `<channel>.dlq.dlq`.
 */
const QUEUES = ['imaging.ai.intake', 'imaging.ai.results'].flatMap((queue) => [
  queue,
  `${queue}.dlq`,
  `${queue}.dlq.dlq`,
]);

/**
 * The first message to arrive on `queue` (taken off it), or an error after `timeoutMs`. The queue
 * may not exist yet (the transport declares it on first publish): the broker then closes the
 * channel, and the next attempt opens another.
 */
async function nextMessage(
  connection: amqplib.ChannelModel,
  queue: string,
  timeoutMs: number,
): Promise<amqplib.GetMessage> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const channel = await connection.createChannel();
    channel.on('error', () => undefined);
    try {
      const message = await channel.get(queue, { noAck: true });
      if (message) return message;
    } catch (error) {
      // amqplib rejects with the broker's channel.close frame
      if ((error as { fields?: { replyCode?: number } }).fields?.replyCode !== 404) throw error;
    } finally {
      await channel.close().catch(() => undefined);
    }
    if (Date.now() > deadline) throw new Error(`nothing arrived on ${queue} in ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

function sha256Of(totalBytes: number): string {
  const hash = createHash('sha256');
  for (const record of syntheticStudy(totalBytes)) hash.update(record);
  return hash.digest('hex');
}

describeWithServer('rabbitmq', 'imaging demo on RabbitMQ', () => {
  describeWithServer('redis', 'and Redis', () => {
    const prefix = `demo-e2e-${randomUUID().slice(0, 8)}`;
    const env = {
      AMQP_URL: SERVERS.rabbitmq.url,
      REDIS_URL: SERVERS.redis.url,
      SEQUENCE_REDIS_PREFIX: prefix,
      // demo:producer and demo:consumer sign and verify claim tickets with it.
      CLAIM_CHECK_KEY: randomBytes(32).toString('base64'),
      PAYLOAD_DIR: undefined,
      CLAIM_CHECK_ABOVE_BYTES: undefined,
    };
    let connection: amqplib.ChannelModel;
    let channel: amqplib.Channel;
    let redis: Redis;
    let consumer: RunningProcess | undefined;

    async function cleanUp(): Promise<void> {
      const admin = await connection.createChannel(); // of its own: a test may break `channel`
      for (const queue of QUEUES) await admin.deleteQueue(queue);
      await admin.close();
      const keys = await redis.keys(`${prefix}:*`);
      if (keys.length > 0) await redis.del(...keys);
    }

    beforeAll(async () => {
      connection = await amqpConnection();
      // Fail the test that uses a broken connection, rather than crash the worker.
      connection.on('error', () => undefined);
      channel = await connection.createChannel();
      channel.on('error', () => undefined);
      redis = redisClient();
    });

    beforeEach(cleanUp);

    afterEach(async () => {
      if (consumer && consumer.child.exitCode === null && consumer.child.signalCode === null) {
        consumer.child.kill('SIGKILL');
        await consumer.exited;
      }
      consumer = undefined;
    });

    afterAll(async () => {
      await cleanUp();
      await connection.close();
      redis.disconnect();
    });

    it('npm start sends a study and gets a matching report, leaving no fragment behind', async () => {
      const exit = await run('npm', ['start'], { ...env, STUDY_BYTES: String(20 * MiB) });

      expect({ code: exit.code, stderr: exit.stderr }).toMatchObject({ code: 0 });
      expect(exit.stdout).toContain(`3 fragments, ${20 * MiB} bytes`);
      expect(exit.stdout).toContain(`sha256 ${sha256Of(20 * MiB)} matched`);
      // Closing let the completing delivery finish: no fragment went back to the queue.
      expect(await channel.checkQueue('imaging.ai.intake')).toMatchObject({ messageCount: 0 });
      // The sequence store was Redis: the completed study left its completion marker there.
      const markers = (await redis.keys(`${prefix}:*`)).filter((key) =>
        /^[^{]*:\{imaging\.ai\.intake:[^}]+\}:done$/.test(key),
      );
      expect(markers).toHaveLength(1);
    });

    it('demo:consumer reports what demo:producer sent and what another program sent by the wire contract, dead-letters a corrupt fragment, and stops on SIGTERM', async () => {
      consumer = start(...npmScript('demo:consumer'), env);
      await consumer.waitForOutput('consuming imaging.ai.intake', 20_000);

      const produced = await run(
        'npm',
        ['run', '--silent', 'demo:producer', '--', '--bytes', '30000000'],
        env,
      );
      expect({ code: produced.code, stderr: produced.stderr }).toMatchObject({ code: 0 });
      // Its stdout is the receipt alone, one JSON line (logs go to stderr).
      const receipt = JSON.parse(produced.stdout.trim());
      expect(receipt).toMatchObject({
        bytes: 30_000_000,
        fragments: 4,
        sha256: sha256Of(30_000_000),
      });

      const report = JSON.parse(
        (await nextMessage(connection, 'imaging.ai.results', 20_000)).content.toString(),
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
      channel.sendToQueue('imaging.ai.intake', study, {
        headers: {
          'x-sequence-version': 1,
          'x-sequence-id': foreignId,
          'x-sequence-position': 1,
          'x-sequence-size': 1,
          'x-sequence-last': true,
          'x-fragment-crc32': crc32(study),
          'x-sequence-bytes': study.length,
          'x-sequence-sha256': sha256Of(600_000),
          'study-uid': '1.2.840.99999.42',
        },
      });
      const foreignReport = JSON.parse(
        (await nextMessage(connection, 'imaging.ai.results', 20_000)).content.toString(),
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
      channel.sendToQueue('imaging.ai.intake', body, {
        headers: {
          'x-sequence-version': 1,
          'x-sequence-id': sequenceId,
          'x-sequence-position': 1,
          'x-sequence-size': 1,
          'x-sequence-last': true,
          'x-fragment-crc32': crc32(Buffer.from('something else')),
          'x-sequence-bytes': body.length,
          'x-sequence-sha256': createHash('sha256').update(body).digest('hex'),
        },
      });
      const deadLetter = await nextMessage(connection, 'imaging.ai.intake.dlq', 20_000);
      expect(deadLetter.content).toEqual(body);
      expect(deadLetter.properties.headers).toMatchObject({
        'x-sequence-id': sequenceId,
        'x-death-reason': expect.stringMatching(/^crc-mismatch/),
      });

      consumer.child.kill('SIGTERM');
      const stopped = await consumer.exited;
      expect({ code: stopped.code, signal: stopped.signal, stderr: stopped.stderr }).toMatchObject({
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
      expect(await channel.checkQueue('imaging.ai.intake')).toMatchObject({ messageCount: 1 });
      expect(await payloadKeys()).toContain(`${prefix}:{payload:${receipt.ticket.ref}}:meta`);

      consumer = start(...npmScript('demo:consumer'), env);
      const report = JSON.parse(
        (await nextMessage(connection, 'imaging.ai.results', 20_000)).content.toString(),
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

      consumer.child.kill('SIGTERM');
      const stopped = await consumer.exited;
      expect({ code: stopped.code, signal: stopped.signal, stderr: stopped.stderr }).toMatchObject({
        code: 0,
        signal: null,
      });
      expect(await channel.checkQueue('imaging.ai.intake')).toMatchObject({ messageCount: 0 });
      expect(await channel.checkQueue('imaging.ai.intake.dlq')).toMatchObject({ messageCount: 0 });
    });
  });
});
