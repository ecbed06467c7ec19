/**
 * The producer side of bench:sequence, in the benchmark process: (a) plain amqplib on a confirm
 * channel (on NATS: sequence-nats.broker.ts), (b) SplitterService over a transport of its own;
 * and the payloads.
 */
import { once } from 'node:events';
import { Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import type * as amqp from 'amqplib';
import { SequenceModule, SplitterService, type Transport } from 'nest-sequence';
import { onCleanup } from './harness/cleanup';
import { nestLogger } from './harness/nest-logger';

/** (a): persistent messages, at most `inFlight` awaiting their confirm at once. */
export async function publishRaw(
  channel: amqp.ConfirmChannel,
  queue: string,
  fragments: Iterable<Buffer>,
  inFlight: number,
): Promise<void> {
  const pending = new Set<Promise<void>>();
  let position = 0;
  for (const body of fragments) {
    position++;
    let writable = true;
    const confirmed = new Promise<void>((resolveConfirm, rejectConfirm) => {
      writable = channel.publish(
        '',
        queue,
        body,
        { persistent: true, headers: { 'x-position': position } },
        (error) =>
          error
            ? rejectConfirm(error instanceof Error ? error : new Error(String(error)))
            : resolveConfirm(),
      );
    });
    const settled: Promise<void> = confirmed.finally(() => pending.delete(settled));
    pending.add(settled);
    if (!writable) await once(channel, 'drain');
    if (pending.size >= inFlight) await Promise.race(pending);
  }
  await Promise.all(pending);
}

export function* slices(payload: Buffer, fragmentBytes: number): Generator<Buffer> {
  for (let offset = 0; offset < payload.length; offset += fragmentBytes) {
    yield payload.subarray(offset, offset + fragmentBytes);
  }
}

/** `total` bytes as fresh 1 MiB chunks: never the whole payload in memory. */
export async function* streamed(total: number, block: Buffer): AsyncGenerator<Buffer> {
  for (let sent = 0; sent < total; sent += block.length) {
    yield Buffer.from(block.subarray(0, Math.min(block.length, total - sent)));
  }
}

export interface Producer {
  readonly splitter: SplitterService;
  close(): Promise<void>;
}

/** (b): the producer's app, SplitterService over a transport of its own; closed at the latest at the end. */
export async function startProducer(
  connectTransport: () => Promise<Transport>,
  inFlight: number,
): Promise<Producer> {
  const transport = await connectTransport();
  const closeTransport = onCleanup('close the producer transport', () => transport.close());
  @Module({
    imports: [
      SequenceModule.forRoot({
        transport,
        publish: { inFlight },
        // The producer consumes nothing.
        tuning: { sweepers: { expiry: { intervalMs: false } } },
      }),
    ],
  })
  class ProducerModule {}
  const app = await NestFactory.createApplicationContext(ProducerModule, {
    logger: nestLogger('producer'),
  });
  const closeApp = onCleanup('close the producer app', () => app.close());
  return {
    splitter: app.get(SplitterService),
    close: async () => {
      await closeApp.run();
      await closeTransport.run();
    },
  };
}
