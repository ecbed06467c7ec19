/**
 * What a long stream leaves behind in its producer: the CPU one `SplitterService.send` of 180 MiB
 * in 1 MiB fragments costs this process, ROUNDS times before and ROUNDS times after sending a
 * 500 MiB stream (1 MiB chunks from an async generator) in fragments of `mode` MiB, over
 * `RabbitMqTransport`; `none` sends no stream. One mode per process; alternate several runs:
 *
 *   node -r ts-node/register/transpile-only -r tsconfig-paths/register \
 *     bench/probes/producer-after-stream.probe.ts none|1|8
 *
 * bench:sequence runs every ratio case before the streamed ones because of what this measures
 * (docs/benchmarks.md, Message Sequence, broker-held). Prints one JSON line (`case`: the mode):
 * CPU milliseconds per send, and V8's major (mark-compact) and minor (scavenge) collections per
 * send, before and after. Its queue (`nseq-probe-stream-<run>`, and `.dlq`) is purged after each
 * send and removed at the end, also on failure or Ctrl-C.
 */
import { randomBytes } from 'node:crypto';
import { constants, PerformanceObserver, type PerformanceEntry } from 'node:perf_hooks';
import { Logger, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { SequenceModule, SplitterService } from 'nest-sequence';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { onCleanup, runBench } from '../harness/cleanup';
import { nestLogger } from '../harness/nest-logger';
import { MiB, report } from '../harness/report';
import { connectAmqp, newRunId, QueueJanitor } from '../harness/resources';
import { servers } from '../harness/settings';

const ROUNDS = 3;
const PAYLOAD_BYTES = 180 * MiB;
const STREAM_BYTES = 500 * MiB;

interface Round {
  readonly cpuMs: number;
  readonly major: number;
  readonly minor: number;
}

/** Counts V8's collections by kind while it observes. */
class Collections {
  major = 0;
  minor = 0;
  private readonly observer = new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      const kind = (entry as PerformanceEntry & { detail?: { kind?: number } }).detail?.kind;
      if (kind === constants.NODE_PERFORMANCE_GC_MAJOR) this.major++;
      if (kind === constants.NODE_PERFORMANCE_GC_MINOR) this.minor++;
    }
  });

  constructor() {
    this.observer.observe({ entryTypes: ['gc'] });
  }

  stop(): void {
    this.observer.disconnect();
  }
}

async function* streamed(total: number, block: Buffer): AsyncGenerator<Buffer> {
  for (let sent = 0; sent < total; sent += block.length) yield Buffer.from(block);
}

async function main(): Promise<void> {
  const mode = process.argv[2];
  if (mode !== 'none' && mode !== '1' && mode !== '8') throw new Error('usage: … none | 1 | 8');
  Logger.overrideLogger(nestLogger('probe'));
  const url = servers.amqpUrl;
  const queue = `nseq-probe-stream-${newRunId()}`;
  new QueueJanitor(url, `${queue}{,.dlq}`).track(queue, `${queue}.dlq`);
  const connection = await connectAmqp(url);
  onCleanup('close the probe connection', () => connection.close());
  const admin = await connection.createChannel();
  const transport = await RabbitMqTransport.connect(url);
  onCleanup('close the transport', () => transport.close());
  @Module({
    imports: [
      SequenceModule.forRoot({
        transport,
        tuning: { sweepers: { expiry: { intervalMs: false } } },
      }),
    ],
  })
  class ProducerModule {}
  const app = await NestFactory.createApplicationContext(ProducerModule, {
    logger: nestLogger('probe'),
  });
  onCleanup('close the producer app', () => app.close());
  const splitter = app.get(SplitterService);
  const payload = randomBytes(PAYLOAD_BYTES);

  const send = async (): Promise<Round> => {
    const collections = new Collections();
    const started = process.cpuUsage();
    await splitter.send(queue, payload, { fragmentBytes: MiB });
    const used = process.cpuUsage(started);
    // The observer hears of a collection a tick after it.
    await new Promise((resolve) => setImmediate(resolve));
    collections.stop();
    await admin.purgeQueue(queue);
    return {
      cpuMs: Math.round((used.user + used.system) / 1000),
      major: collections.major,
      minor: collections.minor,
    };
  };

  const before: Round[] = [];
  for (let i = 0; i < ROUNDS; i++) before.push(await send());
  if (mode !== 'none') {
    await splitter.send(queue, streamed(STREAM_BYTES, randomBytes(MiB)), {
      fragmentBytes: Number(mode) * MiB,
    });
    await admin.purgeQueue(queue);
  }
  const after: Round[] = [];
  for (let i = 0; i < ROUNDS; i++) after.push(await send());
  const mean = (rounds: Round[], field: keyof Round) =>
    Math.round(rounds.reduce((sum, round) => sum + round[field], 0) / rounds.length);
  report(
    { bench: 'producer-after-stream', case: mode, variant: 'default', ratio: null },
    {
      streamFragmentMiB: mode === 'none' ? null : Number(mode),
      before,
      after,
      cpuMsPerSend: { before: mean(before, 'cpuMs'), after: mean(after, 'cpuMs') },
      majorPerSend: { before: mean(before, 'major'), after: mean(after, 'major') },
    },
  );
}

runBench('producer-after-stream', main);
