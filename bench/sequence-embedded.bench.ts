/**
 * Message Sequence on the embedded defaults (in-memory transport, memory store), against the raw
 * in-memory transport moving the same bytes in the same fragment sizes, in the same run.
 *
 *   npm run bench:embedded            (env: BENCH_MB, default 180; BENCH_ROUNDS, default 3)
 *   BENCH_ENCRYPTION=1 npm run bench:embedded
 *
 * (a) raw: publish every fragment with the transport, consume and ack them, concatenate nothing.
 * (b) module: SplitterService.send → @SequencedHandler reading payload.stream() to the end.
 * One warm-up round (discarded), then `BENCH_ROUNDS` rounds, a then b. Prints one JSON line per
 * fragment size (`case`: 8MiB, 1MiB) with MB/s of each and the median ratio b/a. (No memory
 * figure: both paths share this process and the payload itself; see bench:sequence for RSS.)
 *
 * BENCH_ENCRYPTION=1 adds (c), in each round after b: the same as b on an application whose
 * memory store encrypts (`sequence.encryption`), reported as `encryptedMBps` and
 * `encryptionRatio` (median per-round c/b), on the same `default` line.
 *
 * BENCH_EVENTS=1 adds (d), in each round after b: the same as b with a subscriber on
 * `SequenceEvents.events$` (counting every event), reported as `subscribedMBps` and `eventsRatio`
 * (median per-round d/b: what listening to the lifecycle events costs), and a 16 KiB fragment
 * case, where the per-fragment events weigh most.
 */
import 'reflect-metadata';
import { randomBytes } from 'node:crypto';
import { Injectable, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import {
  InMemoryTransport,
  ReassembledPayload,
  SequenceModule,
  SequencedHandler,
  SequenceEvents,
  SplitterService,
  type SequenceModuleOptions,
} from 'nest-sequence';
import { onCleanup, runBench } from './harness/cleanup';
import { timed } from './harness/measure';
import { nestLogger } from './harness/nest-logger';
import { mbPerSecond, median, MiB, ratiosOf, report } from './harness/report';
import { roundsOf } from './harness/rounds';
import { positiveInteger, positiveNumber, readSettings } from './harness/settings';

const settings = readSettings(() => ({
  totalBytes: Math.round(positiveNumber('BENCH_MB', 180) * MiB),
  rounds: positiveInteger('BENCH_ROUNDS', 3),
  encryption: process.env.BENCH_ENCRYPTION === '1',
  events: process.env.BENCH_EVENTS === '1',
}));
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

/** An application of its own, on a transport of its own; `options.sequence` as given. */
async function startApp(transport: InMemoryTransport, options: SequenceModuleOptions = {}) {
  @Module({ imports: [SequenceModule.forRoot({ ...options, transport })], providers: [Drain] })
  class BenchModule {}
  const app = await NestFactory.createApplicationContext(BenchModule, {
    logger: nestLogger('embedded'),
  });
  return { app, splitter: app.get(SplitterService) };
}

async function sendAndDrain(splitter: SplitterService, payload: Buffer, fragmentBytes: number) {
  const delivered = new Promise<number>((resolve) => (onDelivered = resolve));
  await splitter.send(CHANNEL, payload, { fragmentBytes });
  await delivered;
}

async function main(): Promise<void> {
  const transport = new InMemoryTransport({ maxMessageBytes: 16 * MiB });
  const { app, splitter } = await startApp(transport);
  const closeApp = onCleanup('close the app', () => app.close());
  const encrypted = settings.encryption
    ? await startApp(new InMemoryTransport({ maxMessageBytes: 16 * MiB }), {
        sequence: { encryption: { keys: [{ id: 'bench', key: randomBytes(32) }] } },
      })
    : undefined;
  const closeEncrypted = onCleanup('close the encrypting app', async () => encrypted?.app.close());
  const payload = Buffer.alloc(settings.totalBytes, 7);

  const events = app.get(SequenceEvents);
  let eventCount = 0;
  /** (d): b with a subscriber counting every lifecycle event. */
  const listened = async (fragmentBytes: number) => {
    const subscription = events.events$.subscribe(() => eventCount++);
    try {
      return await timed(() => sendAndDrain(splitter, payload, fragmentBytes));
    } finally {
      subscription.unsubscribe();
    }
  };
  const fragmentSizes = settings.events ? [8 * MiB, 1 * MiB, 16 * 1024] : [8 * MiB, 1 * MiB];
  for (const fragmentBytes of fragmentSizes) {
    const a: number[] = [];
    const b: number[] = [];
    const c: number[] = [];
    const d: number[] = [];
    for (const round of roundsOf({ rounds: settings.rounds, warmUp: true, alternate: false })) {
      const rawSeconds = await timed(() => raw(transport, payload, fragmentBytes));
      // (d) before b in even rounds, after it in odd ones: a drifting load favours neither.
      const listenFirst = settings.events && round.number % 2 === 0;
      let subscribedSeconds = listenFirst ? await listened(fragmentBytes) : undefined;
      const moduleSeconds = await timed(() => sendAndDrain(splitter, payload, fragmentBytes));
      if (settings.events && !listenFirst) subscribedSeconds = await listened(fragmentBytes);
      const encryptedSeconds =
        encrypted && (await timed(() => sendAndDrain(encrypted.splitter, payload, fragmentBytes)));
      if (round.warmUp) continue;
      if (subscribedSeconds) d.push(mbPerSecond(settings.totalBytes, subscribedSeconds));
      a.push(mbPerSecond(settings.totalBytes, rawSeconds));
      b.push(mbPerSecond(settings.totalBytes, moduleSeconds));
      if (encryptedSeconds) c.push(mbPerSecond(settings.totalBytes, encryptedSeconds));
    }
    const { ratio } = ratiosOf(a.map((baseline, i) => ({ baseline, module: b[i] })));
    const encryption = encrypted && {
      encryptedMBps: median(c),
      encryptionRatio: ratiosOf(b.map((baseline, i) => ({ baseline, module: c[i] }))).ratio,
    };
    const subscribed = settings.events && {
      subscribedMBps: median(d),
      eventsRatio: ratiosOf(b.map((baseline, i) => ({ baseline, module: d[i] }))).ratio,
      eventsSeen: eventCount,
    };
    const fragmentCase =
      fragmentBytes >= MiB ? `${fragmentBytes / MiB}MiB` : `${fragmentBytes / 1024}KiB`;
    report(
      { bench: 'sequence-embedded', case: fragmentCase, variant: 'default', ratio },
      {
        mb: settings.totalBytes / MiB,
        fragmentMiB: fragmentBytes / MiB,
        rounds: settings.rounds,
        rawMBps: median(a),
        moduleMBps: median(b),
        ...encryption,
        ...subscribed,
      },
    );
  }
  await closeEncrypted.run();
  await closeApp.run();
}

runBench('embedded', main);
