/**
 * The module consumer (b) of the RabbitMQ benchmark: SequenceModule over RabbitMqTransport and
 * RedisSequenceStore, a @SequencedHandler reading payload.stream() to the end. Loaded by
 * sequence-rabbitmq.consumer.ts in module mode only.
 *
 * The store is wrapped to time accept, the reads of a complete sequence (SequenceDelivery's
 * SHA-256 check, when it was not verified at intake, then the handler's stream) and finish; the
 * Redis client to count commands.
 * Neither wrapper changes what the store or the client does.
 */
import 'reflect-metadata';
import type { Readable } from 'node:stream';
import { ConsoleLogger, Injectable, Logger, Module } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { Redis } from 'ioredis';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import {
  ReassembledPayload,
  SequenceModule,
  SequencedHandler,
  type ExpiredSequence,
  type SequenceStore,
} from 'nest-sequence';
import { RedisSequenceStore } from 'nest-sequence/redis';
import { ChannelRegistry } from '../libs/sequence/src/kernel/channel.registry';
import {
  type AcceptContext,
  type AcceptResult,
  type FinishContext,
  type FinishedOutcome,
  type FragmentRecord,
  type SequenceRef,
  type SequenceStoreStats,
} from 'nest-sequence/ports';
import type { Run } from './sequence-rabbitmq.consumer';
import {
  epochMs,
  type ConsumerConfig,
  type ModuleTrace,
  type RedisCommandTally,
} from './sequence-rabbitmq.protocol';

/** Nest and library logs go to stderr (the producer's stdout carries only JSON lines). */
class StderrLogger extends ConsoleLogger {
  protected override printMessages(...args: Parameters<ConsoleLogger['printMessages']>): void {
    super.printMessages(args[0], args[1], args[2], 'stderr', args[4]);
  }
}

type MutableTrace = { -readonly [K in keyof ModuleTrace]: ModuleTrace[K] } & {
  redis: Record<string, RedisCommandTally>;
  concurrentAccepts: number;
  reads: number;
  inHandler: boolean;
};

function emptyTrace(): MutableTrace {
  return {
    accepts: 0,
    acceptMs: 0,
    maxConcurrentAccepts: 0,
    concurrentAccepts: 0,
    reads: 0,
    inHandler: false,
    redis: {},
  };
}

let trace = emptyTrace();

/** The Redis store, timed; behaviour unchanged. */
class TracedStore implements SequenceStore {
  readonly name: string;
  readonly verifiesReads?: boolean;

  constructor(
    private readonly inner: SequenceStore,
    private readonly currentRun: () => Run | undefined,
  ) {
    this.name = inner.name;
    this.verifiesReads = inner.verifiesReads;
  }

  async accept(fragment: FragmentRecord, context: AcceptContext): Promise<AcceptResult> {
    const started = epochMs();
    trace.firstAcceptAt ??= started;
    trace.accepts++;
    trace.maxConcurrentAccepts = Math.max(trace.maxConcurrentAccepts, ++trace.concurrentAccepts);
    try {
      const result = await this.inner.accept(fragment, context);
      if (result.status === 'complete') trace.completeAt = epochMs();
      return result;
    } finally {
      trace.concurrentAccepts--;
      trace.acceptMs += epochMs() - started;
    }
  }

  read(ref: SequenceRef): Readable {
    const stream = this.inner.read(ref);
    trace.reads++;
    // A read before the handler started is the verification pass (absent when the sequence was
    // verified at intake).
    const verify = !trace.inHandler;
    const started = epochMs();
    if (verify) trace.verifyStartAt = started;
    else trace.handlerStartAt = started;
    stream.once('end', () => {
      if (verify) trace.verifyEndAt = epochMs();
      else trace.handlerEndAt = epochMs();
    });
    return stream;
  }

  async finish(
    ref: SequenceRef,
    outcome: Exclude<FinishedOutcome, 'expired'>,
    context: FinishContext,
  ): Promise<boolean> {
    const finished = await this.inner.finish(ref, outcome, context);
    trace.finishEndAt = epochMs();
    const run = this.currentRun();
    const figures = trace;
    // The ack goes out right after finish resolves: let it, then report.
    if (run) setImmediate(() => run.settle(figures));
    return finished;
  }

  renewLease(ref: SequenceRef, consumerId: string, leaseMs: number, now: number) {
    return this.inner.renewLease(ref, consumerId, leaseMs, now);
  }
  releaseLease(ref: SequenceRef, consumerId: string, now: number) {
    return this.inner.releaseLease(ref, consumerId, now);
  }
  listExpired(now: number, limit: number): Promise<SequenceRef[]> {
    return this.inner.listExpired(now, limit);
  }
  expire(ref: SequenceRef, now: number, retentionMs: number): Promise<ExpiredSequence | null> {
    return this.inner.expire(ref, now, retentionMs);
  }
  stats(now: number): Promise<SequenceStoreStats> {
    return this.inner.stats(now);
  }
  ping(): Promise<void> {
    return this.inner.ping();
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

interface TracedCommand {
  name: string;
  args: unknown[];
  promise: Promise<unknown>;
}

/** Counts the client's commands by name (scripts by their defineCommand name), with latencies. */
function traceRedisCommands(client: Redis): void {
  const scripts = (client as unknown as { scriptsSet: Record<string, { sha: string }> }).scriptsSet;
  const scriptName = (sha: unknown) =>
    Object.entries(scripts).find(([, script]) => script.sha === sha)?.[0];
  const target = client as unknown as {
    sendCommand(command: TracedCommand, stream?: unknown): unknown;
  };
  const original = target.sendCommand.bind(client);
  target.sendCommand = (command, stream) => {
    const name =
      command.name === 'evalsha' ? (scriptName(command.args[0]) ?? command.name) : command.name;
    const tally = (trace.redis[name] ??= { calls: 0, ms: 0, bytesOut: 0 });
    tally.calls++;
    for (const arg of command.args) if (Buffer.isBuffer(arg)) tally.bytesOut += arg.length;
    const started = epochMs();
    const stop = () => (tally.ms += epochMs() - started);
    command.promise.then(stop, stop);
    return original(command, stream);
  };
}

export async function startModuleConsumer(
  config: ConsumerConfig,
  currentRun: () => Run | undefined,
): Promise<{ prefetch: number; arm(): void; stop(): Promise<void> }> {
  Logger.overrideLogger(new StderrLogger('consumer', { logLevels: ['error', 'warn'] }));
  const transport = await RabbitMqTransport.connect(config.amqpUrl, {
    prefetch: config.prefetch,
    unsafeSocketTricks: config.unsafeSocketTricks,
  });
  const client = new Redis(config.redisUrl);
  const store = new RedisSequenceStore(client, {
    prefix: config.redisPrefix,
    readAhead: config.readAhead,
    unsafeSocketTricks: config.unsafeSocketTricks,
  });
  traceRedisCommands(client);

  @Injectable()
  class Drain {
    @SequencedHandler({ channel: config.queue })
    async consume(payload: ReassembledPayload): Promise<void> {
      trace.inHandler = true;
      let bytes = 0;
      for await (const chunk of payload.stream()) bytes += (chunk as Buffer).length;
      const run = currentRun();
      if (!run) throw new Error('a sequence completed outside a run');
      if (bytes !== run.bytes) {
        throw new Error(`handler read ${bytes} bytes, the run sent ${run.bytes}`);
      }
      run.done(bytes);
    }
  }

  @Module({
    imports: [
      SequenceModule.forRoot({
        transport,
        prefetch: config.prefetch,
        sequence: { store: new TracedStore(store, currentRun) },
      }),
    ],
    providers: [Drain],
  })
  class ConsumerModule {}

  const app = await NestFactory.createApplicationContext(ConsumerModule, {
    logger: new StderrLogger('consumer', { logLevels: ['error', 'warn'] }),
  });
  const registered = app.get(ChannelRegistry).get(config.queue);
  if (!registered) throw new Error(`no @SequencedHandler on ${config.queue}`);
  return {
    prefetch: registered.prefetch,
    arm: () => {
      trace = emptyTrace();
    },
    stop: async () => {
      await app.close();
      await transport.close();
      await store.close();
      await client.quit().catch(() => client.disconnect());
    },
  };
}
