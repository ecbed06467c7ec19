/**
 * The outbox relay's publish pattern without the relay: LOOPS loops, each publishing BATCH 1 KiB
 * messages at once (with the relay's headers) and awaiting all their confirms before the next
 * batch, as a relay's claims do. Through `RabbitMqTransport.publish` (`transport`), or through
 * plain amqplib on a confirm channel (`raw`). One mode per process; alternate several runs:
 *
 *   node -r ts-node/register/transpile-only bench/outbox-publish-pattern.probe.ts raw
 *   node -r ts-node/register/transpile-only bench/outbox-publish-pattern.probe.ts transport
 *
 * docs/benchmarks.md (Transactional Outbox, session 12) cites it.
 */
import * as amqplib from 'amqplib';
import { Logger } from '@nestjs/common';
import { RabbitMqTransport } from '../libs/sequence/src/adapters/transports/rabbitmq/rabbitmq.transport';

const URL = process.env.AMQP_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
const MESSAGES = 20_000;
const BATCH = 100;
const LOOPS = 3;
const body = Buffer.alloc(1024, 120);
const headers = {
  'x-message-id': '3f1c0d9e-2c53-4e0c-9a43-8d3d55bb4d1a',
  'x-message-kind': 'event',
  'x-message-type': 'OrderPlaced',
  'content-type': 'application/json',
};

/** Messages per second, publishing MESSAGES in LOOPS loops of BATCH at once. */
async function inBatches(publishOne: () => Promise<void>): Promise<number> {
  let left = MESSAGES;
  const started = Date.now();
  await Promise.all(
    Array.from({ length: LOOPS }, async () => {
      while (left > 0) {
        const count = Math.min(BATCH, left);
        left -= count;
        await Promise.all(Array.from({ length: count }, publishOne));
      }
    }),
  );
  return Math.round(MESSAGES / ((Date.now() - started) / 1000));
}

async function main(): Promise<void> {
  const mode = process.argv[2];
  if (mode !== 'raw' && mode !== 'transport') throw new Error('usage: … raw | transport');
  Logger.overrideLogger(['error']);
  const queue = `nseq-probe-publish-${process.pid}`;
  const admin = await amqplib.connect(URL);
  const channel = await admin.createChannel();
  try {
    if (mode === 'raw') {
      await channel.assertQueue(queue, { durable: true });
      const connection = await amqplib.connect(URL);
      const confirms = await connection.createConfirmChannel();
      const rate = await inBatches(
        () =>
          new Promise<void>((resolve, reject) =>
            confirms.publish(
              '',
              queue,
              body,
              { persistent: true, mandatory: true, messageId: headers['x-message-id'], headers },
              // amqplib's confirm callback: null on ack, an Error on nack.
              (error: Error | null) => (error ? reject(error) : resolve()),
            ),
          ),
      );
      console.log(JSON.stringify({ mode, messagesPerSecond: rate }));
      await connection.close();
    } else {
      const transport = await RabbitMqTransport.connect(URL);
      await transport.publish(queue, body, headers); // declares the queue and its .dlq
      const rate = await inBatches(() => transport.publish(queue, body, headers));
      console.log(JSON.stringify({ mode, messagesPerSecond: rate }));
      await transport.close();
    }
  } finally {
    await channel.deleteQueue(queue);
    await channel.deleteQueue(`${queue}.dlq`);
    await admin.close();
  }
}

void main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
