/**
 * The outbox relay's publish pattern without the relay: LOOPS loops, each publishing BATCH 1 KiB
 * messages at once (with the relay's headers) and awaiting all their confirms before the next
 * batch, as a relay's claims do. Through `RabbitMqTransport.publish` (`transport`), or through
 * plain amqplib on a confirm channel (`raw`). One mode per process; alternate several runs:
 *
 *   node -r ts-node/register/transpile-only -r tsconfig-paths/register \
 *     bench/probes/outbox-publish-pattern.probe.ts raw|transport
 *
 * bench:outbox measures raw publishing and the relay as a whole, not the transport on its own:
 * this probe tells the transport's share of the gap between them. docs/benchmarks.md
 * (Transactional Outbox) cites it. Prints one JSON line (`case`: the mode); its queue
 * (`nseq-probe-publish-<run>` and its `.dlq`) is removed at the end, also on failure or Ctrl-C.
 */
import { Logger } from '@nestjs/common';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { onCleanup, runBench } from '../harness/cleanup';
import { nestLogger } from '../harness/nest-logger';
import { report } from '../harness/report';
import { connectAmqp, newRunId, QueueJanitor } from '../harness/resources';
import { servers } from '../harness/settings';

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
  Logger.overrideLogger(nestLogger('probe'));
  const url = servers.amqpUrl;
  const queue = `nseq-probe-publish-${newRunId()}`;
  new QueueJanitor(url, `${queue}{,.dlq}`).track(queue, `${queue}.dlq`);
  let rate: number;
  if (mode === 'raw') {
    const connection = await connectAmqp(url);
    const admin = await connection.createChannel();
    await admin.assertQueue(queue, { durable: true });
    const confirms = await connection.createConfirmChannel();
    rate = await inBatches(
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
  } else {
    const transport = await RabbitMqTransport.connect(url);
    onCleanup('close the transport', () => transport.close());
    await transport.publish(queue, body, headers); // declares the queue and its .dlq
    rate = await inBatches(() => transport.publish(queue, body, headers));
  }
  report(
    { bench: 'outbox-publish-pattern', case: mode, variant: 'default', ratio: null },
    { mode, messagesPerSecond: rate },
  );
}

runBench('outbox-publish-pattern', main);
