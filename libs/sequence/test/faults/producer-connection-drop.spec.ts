import { randomUUID } from 'node:crypto';
import { Test } from '@nestjs/testing';
import type { INestApplicationContext } from '@nestjs/common';
import {
  PublishTimeoutError,
  SequenceModule,
  SequencePublishError,
  SplitterService,
} from 'nest-sequence';
import type { PublishPolicy } from '../../src/options/module-options';
import { sha256Hex } from '../../src/core/checksum';
import { bytes, eventually } from '../support/sequence-test-app';
import { namedTransport } from '../support/rabbitmq.fixture';
import { createRealServersApp, type RealServersApp } from './support/real-servers.app';
import { useFaultServers } from './support/fault-servers';
import { describeOnRealServers } from './support/real-servers';

jest.setTimeout(30_000);

const FRAGMENT_BYTES = 16_000;
const CHUNKS = 30;
/** The stream stops after this many chunks until the broker has dropped the connection. */
const CHUNKS_BEFORE_THE_DROP = 10;

/** A producer: SplitterService over a RabbitMQ connection of its own, named for the broker. */
interface Producer {
  readonly splitter: SplitterService;
  readonly connectionName: string;
  close(): Promise<void>;
}

async function startProducer(publish: PublishPolicy, reconnectSeconds: number) {
  const connectionName = `nseq-fault-producer-${randomUUID()}`;
  const transport = await namedTransport(connectionName, { reconnectSeconds });
  const moduleRef = await Test.createTestingModule({
    imports: [
      SequenceModule.forRoot({
        transport,
        publish,
        metrics: false,
        tuning: { sweepers: { expiry: { intervalMs: false } } },
      }),
    ],
  }).compile();
  moduleRef.useLogger(false);
  const app: INestApplicationContext = await moduleRef.init();
  return {
    splitter: app.get(SplitterService),
    connectionName,
    close: async () => {
      await app.close();
      await transport.close();
    },
  } satisfies Producer;
}

/**
 * The payload as a slow stream of 16,000-byte chunks (one fragment each): after the first
 * CHUNKS_BEFORE_THE_DROP chunks it waits for `drop()` to finish, so the connection goes away
 * after fragment 9 is confirmed and before fragment 10 is published.
 */
async function* slowStream(payload: Buffer, drop: () => Promise<void>): AsyncGenerator<Buffer> {
  for (let chunk = 0; chunk < CHUNKS; chunk++) {
    if (chunk === CHUNKS_BEFORE_THE_DROP) await drop();
    yield Buffer.from(payload.subarray(chunk * FRAGMENT_BYTES, (chunk + 1) * FRAGMENT_BYTES));
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/**
 * Guarantees table, RabbitMQ connection dropped under a producer mid-sequence (the broker closes
 * it, as `rabbitmqctl close_connection` does for an operator or a node failover): `send` either
 * resolves and the sequence completes, or rejects with a typed error, never a silent partial.
 */
describeOnRealServers('faults: the producer connection dropped mid-sequence', () => {
  let channel: string;
  let consumer: RealServersApp | undefined;
  let producer: Producer | undefined;
  const servers = useFaultServers({
    beforeCleanup: async () => {
      await producer?.close();
      await consumer?.close();
      producer = consumer = undefined;
    },
  });

  beforeEach(() => {
    channel = servers.admin.newChannel();
  });

  /** The consumer, expiring incomplete sequences `timeoutMs` after their first fragment. */
  async function startConsumer(timeoutMs: number): Promise<RealServersApp> {
    consumer = await createRealServersApp(channel, {
      prefix: servers.prefix,
      handler: {
        timeoutMs,
      },
      tuning: { sweepers: { expiry: { intervalMs: 100 } } },
    });
    return consumer;
  }

  it('resolves once the connection is back, within the retry budget, and the consumer delivers the sequence once, byte-exact', async () => {
    const consumer = await startConsumer(30_000);
    producer = await startProducer(
      {
        confirmTimeoutMs: 3_000,
        retry: {
          attempts: 5,
          baseDelayMs: 100,
          maxDelayMs: 500,
        },
      },
      0.2,
    );
    const payload = bytes(CHUNKS * FRAGMENT_BYTES, 101);
    const droppedPid = await servers.admin.connectionPid(producer.connectionName);

    const receipt = await producer.splitter.send(
      channel,
      slowStream(payload, () => servers.admin.closeConnection(producer!.connectionName)),
      { sequenceId: 'survives-the-drop', fragmentBytes: FRAGMENT_BYTES },
    );

    // It really was cut off: the broker now lists a new connection under the same name.
    expect(await servers.admin.connectionPid(producer.connectionName)).not.toBe(droppedPid);
    expect(receipt).toEqual({
      channel,
      sequenceId: 'survives-the-drop',
      fragments: CHUNKS,
      bytes: payload.length,
      sha256: sha256Hex(payload),
    });
    await eventually(() => consumer.handler.calls > 0, 'the sequence delivered', 10_000);
    await eventually(
      async () => (await servers.admin.readyCount(channel)) === 0,
      'the queue drained',
    );
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(consumer.handler.calls).toBe(1);
    expect(consumer.handler.of('survives-the-drop')[0].bytes.equals(payload)).toBe(true);
    expect(await servers.admin.readyCount(`${channel}.dlq`)).toBe(0);
  });

  it('rejects with SequencePublishError naming the sequence and the fragment when the budget runs out first; the consumer expires the partial sequence with an expiry record', async () => {
    const consumer = await startConsumer(1_500);
    // The connection comes back after 5 s; two 300 ms attempts per fragment, no backoff (so the
    // first fragment after the drop is also the first to fail for good).
    producer = await startProducer(
      {
        confirmTimeoutMs: 300,
        retry: {
          attempts: 2,
          baseDelayMs: 0,
          maxDelayMs: 0,
        },
      },
      5,
    );
    const payload = bytes(CHUNKS * FRAGMENT_BYTES, 102);

    const error: unknown = await producer.splitter
      .send(
        channel,
        slowStream(payload, () => servers.admin.closeConnection(producer!.connectionName)),
        { sequenceId: 'cut-short', fragmentBytes: FRAGMENT_BYTES },
      )
      .then(
        () => undefined,
        (rejection: unknown) => rejection,
      );

    expect(error).toBeInstanceOf(SequencePublishError);
    expect(error).toMatchObject({
      name: 'SequencePublishError',
      code: 'publish-failed',
      channel,
      sequenceId: 'cut-short',
      position: CHUNKS_BEFORE_THE_DROP,
      attempts: 2,
    });
    expect((error as SequencePublishError).cause).toBeInstanceOf(PublishTimeoutError);

    await eventually(
      async () => (await servers.admin.readyCount(`${channel}.dlq`)) === 1,
      'the expiry record',
      10_000,
    );
    const [record] = await servers.admin.drain(`${channel}.dlq`);
    expect(String(record.headers['x-death-reason'])).toMatch(
      /^sequence-expired: sequence cut-short expired after \d+ ms with 9 fragment\(s\) received/,
    );
    expect(record.headers['x-sequence-id']).toBe('cut-short');
    const expiry = JSON.parse(record.body.toString()) as Record<string, unknown>;
    // Streamed: no fragment before the last declares the size, so none is known to be missing.
    expect(expiry).toMatchObject({
      kind: 'sequence-expired',
      channel,
      sequenceId: 'cut-short',
      receivedPositions: [1, 2, 3, 4, 5, 6, 7, 8, 9],
      missingPositions: [],
      bufferedBytes: 9 * FRAGMENT_BYTES,
    });
    expect(expiry).not.toHaveProperty('size');
    expect(consumer.handler.calls).toBe(0);
    expect(await servers.admin.readyCount(channel)).toBe(0);
  });
});
