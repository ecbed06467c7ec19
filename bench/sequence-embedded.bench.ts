/**
 * Message Sequence on the embedded defaults (in-memory transport, memory store), against the raw
 * in-memory transport moving the same bytes in the same fragment sizes, in the same run.
 *
 *   npm run bench:embedded            (env: BENCH_MB, default 180; BENCH_ROUNDS, default 3)
 *
 * (a) raw: publish every fragment with the transport, consume and ack them, concatenate nothing.
 * (b) module: SplitterService.send → @SequencedHandler reading payload.stream() to the end.
 * Prints one JSON line per fragment size with MB/s of each and the median ratio b/a. (No memory
 * figure: both paths share this process and the payload itself; see bench:sequence for RSS.)
 */
import 'reflect-metadata';
import { Injectable } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Module } from '@nestjs/common';
import {
  InMemoryTransport,
  ReassembledPayload,
  SequenceModule,
  SequencedHandler,
  SplitterService,
} from 'nest-sequence';
import { MiB, mbPerSecond, median, report, timed } from './bench.util';

const totalBytes = Number(process.env.BENCH_MB ?? 180) * MiB;
const rounds = Number(process.env.BENCH_ROUNDS ?? 3);
const CHANNEL = 'bench.embedded';

let onDelivered: (bytes: number) => void = () => {};

@Injectable()
class Drain {
  @SequencedHandler({ channel: CHANNEL })
  async consume(payload: ReassembledPayload): Promise<void> {
    let bytes = 0;
    for await (const chunk of payload.stream()) bytes += (chunk as Buffer).length;
    onDelivered(bytes);
  }
}

async function raw(transport: InMemoryTransport, payload: Buffer, fragmentBytes: number) {
  const channel = `bench.raw.${fragmentBytes}`;
  const fragments = Math.ceil(payload.length / fragmentBytes);
  let received = 0;
  let done!: () => void;
  const finished = new Promise<void>((resolve) => (done = resolve));
  const subscription = await transport.subscribe(channel, async (message) => {
    received += message.body.length;
    if (received === payload.length) done();
    return { action: 'ack' };
  });
  for (let i = 0; i < fragments; i++) {
    await transport.publish(channel, payload.subarray(i * fragmentBytes, (i + 1) * fragmentBytes), {
      'x-position': i + 1,
    });
  }
  await finished;
  await subscription.close();
}

async function main(): Promise<void> {
  const transport = new InMemoryTransport({ maxMessageBytes: 16 * MiB });
  @Module({ imports: [SequenceModule.forRoot({ transport })], providers: [Drain] })
  class BenchModule {}
  const app = await NestFactory.createApplicationContext(BenchModule, { logger: ['error'] });
  const splitter = app.get(SplitterService);
  const payload = Buffer.alloc(totalBytes, 7);

  for (const fragmentBytes of [8 * MiB, 1 * MiB]) {
    const a: number[] = [];
    const b: number[] = [];
    for (let round = 0; round <= rounds; round++) {
      const rawSeconds = await timed(() => raw(transport, payload, fragmentBytes));
      const moduleSeconds = await timed(async () => {
        const delivered = new Promise<number>((resolve) => (onDelivered = resolve));
        await splitter.send(CHANNEL, payload, { fragmentBytes });
        await delivered;
      });
      if (round === 0) continue; // warm-up
      a.push(mbPerSecond(totalBytes, rawSeconds));
      b.push(mbPerSecond(totalBytes, moduleSeconds));
    }
    const ratios = a.map((value, i) => b[i] / value);
    report({
      bench: 'sequence-embedded',
      mb: totalBytes / MiB,
      fragmentMiB: fragmentBytes / MiB,
      rounds,
      rawMBps: median(a),
      moduleMBps: median(b),
      ratio: Math.round(median(ratios) * 100) / 100,
    });
  }
  await app.close();
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
