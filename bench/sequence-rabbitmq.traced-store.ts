/**
 * What the RabbitMQ benchmark's module consumer notes about where a run's time went
 * ({@link ModuleTrace}): a SequenceStore wrapper that times accept, the reads of a complete
 * sequence (SequenceDelivery's SHA-256 check, when it was not verified at intake, then the
 * handler's stream) and finish; and a tally of the Redis client's commands. Neither changes what
 * the store or the client does.
 */
import type { Readable } from 'node:stream';
import type { Redis } from 'ioredis';
import type { ExpiredSequence, SequenceStore } from 'nest-sequence';
import type {
  AcceptContext,
  AcceptResult,
  FinishContext,
  FinishedOutcome,
  FragmentRecord,
  SequenceRef,
  SequenceStatus,
  SequenceStoreStats,
} from 'nest-sequence/ports';
import { epochMs } from './harness/measure';
import type { ModuleTrace, RedisCommandTally } from './sequence-rabbitmq.protocol';

type MutableTrace = { -readonly [K in keyof ModuleTrace]: ModuleTrace[K] } & {
  redis: Record<string, RedisCommandTally>;
  concurrentAccepts: number;
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

/** The trace of the current run; `reset()` when a run is armed. */
export class TraceRecorder {
  current = emptyTrace();

  reset(): void {
    this.current = emptyTrace();
  }

  /** The handler started reading: a read from now on is the handler's, not the verification. */
  handlerStarted(): void {
    this.current.inHandler = true;
  }
}

/** The store, timed; behaviour unchanged. `finished` is told when a sequence's finish resolved. */
export class TracedStore implements SequenceStore {
  readonly name: string;
  readonly verifiesReads?: boolean;

  constructor(
    private readonly inner: SequenceStore,
    private readonly recorder: TraceRecorder,
    private readonly finished: (trace: ModuleTrace) => void,
  ) {
    this.name = inner.name;
    this.verifiesReads = inner.verifiesReads;
  }

  async accept(fragment: FragmentRecord, context: AcceptContext): Promise<AcceptResult> {
    const trace = this.recorder.current;
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

  /** Broker-held reassembly's one read per sequence; not timed. */
  status(ref: SequenceRef, now: number): Promise<SequenceStatus> {
    return this.inner.status!(ref, now);
  }

  read(ref: SequenceRef): Readable {
    const trace = this.recorder.current;
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
    const trace = this.recorder.current;
    trace.finishEndAt = epochMs();
    this.finished(trace);
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
export function traceRedisCommands(client: Redis, recorder: TraceRecorder): void {
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
    const tally = (recorder.current.redis[name] ??= { calls: 0, ms: 0, bytesOut: 0 });
    tally.calls++;
    for (const arg of command.args) if (Buffer.isBuffer(arg)) tally.bytesOut += arg.length;
    const started = epochMs();
    const stop = () => (tally.ms += epochMs() - started);
    command.promise.then(stop, stop);
    return original(command, stream);
  };
}
