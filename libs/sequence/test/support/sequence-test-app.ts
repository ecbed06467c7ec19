import {
  Injectable,
  type INestApplicationContext,
  type ModuleMetadata,
  type Provider,
  type Type,
} from '@nestjs/common';
import type { Registry } from 'prom-client';
import { ExpirySweeper } from '../../src/sequence/expiry.sweeper';
import {
  InMemoryTransport,
  MemorySequenceStore,
  ReassembledPayload,
  SequencedHandler,
  SplitterService,
  type HandlerContext,
  type InboundMessage,
  type SequenceModuleOptions,
  type SequenceStore,
  type SequencedHandlerOptions,
  type Transport,
} from 'nest-sequence';
import { ModuleMetrics } from '../../src/kernel/module-metrics';
import { buildFragmentHeaders, type HeaderMap } from 'nest-sequence/wire';
import { type PublishOptions } from 'nest-sequence/ports';
import { crc32, sha256Hex } from '../../src/core/checksum';
import { partitionIndex } from '../../src/core/partition';
import { ForwardingTransport } from '../../src/testing/forwarding.transport';
import { mergeOptions } from './merge-options';
import { createTestApp } from './test-app';

/** What a test handler saw of one delivery. */
export interface Delivery {
  readonly payload: ReassembledPayload;
  readonly bytes: Buffer;
}

/**
 * A handler provider for tests: records every delivery (reading the whole payload), and can be
 * told to fail its next calls.
 */
export function recordingHandler(options: SequencedHandlerOptions): Type<RecordingHandler> {
  @Injectable()
  class Handler extends RecordingHandler {
    @SequencedHandler(options)
    override async handle(payload: ReassembledPayload, context: HandlerContext): Promise<void> {
      await super.handle(payload, context);
    }
  }
  return Handler;
}

export class RecordingHandler {
  readonly deliveries: Delivery[] = [];
  calls = 0;
  /** Number of upcoming calls that throw. */
  failNext = 0;
  /** Awaited at the start of every call (after counting it), e.g. to hold the handler mid-call. */
  onCall?: (payload: ReassembledPayload, context: HandlerContext) => Promise<void>;

  async handle(payload: ReassembledPayload, context: HandlerContext): Promise<void> {
    this.calls++;
    await this.onCall?.(payload, context);
    if (this.failNext > 0) {
      this.failNext--;
      throw new Error(`handler failure #${this.calls}`);
    }
    this.deliveries.push({ payload, bytes: await payload.toBuffer() });
  }

  /** Deliveries of one sequence id. */
  of(sequenceId: string): Delivery[] {
    return this.deliveries.filter((d) => d.payload.sequenceId === sequenceId);
  }
}

export interface SequenceTestApp {
  readonly app: INestApplicationContext;
  readonly transport: InMemoryTransport;
  readonly store: SequenceStore;
  readonly handler: RecordingHandler;
  readonly splitter: SplitterService;
  readonly sweeper: ExpirySweeper;
  readonly metrics: ModuleMetrics;
  close(): Promise<void>;
}

/**
 * A Nest application with SequenceModule and one recording `@SequencedHandler` on `channel`.
 * Pass a shared `transport` / `store` to run several instances against the same ones (each test
 * closes what it created). The sweeper's timer is off unless `tuning.sweepers.expiry` is given:
 * tests call `sweeper.sweep(now)` themselves.
 */
export async function createSequenceTestApp(
  channel: string,
  options: SequenceModuleOptions & {
    handler?: Omit<SequencedHandlerOptions, 'channel'>;
    /** More modules for the app (e.g. ScheduleModule.forRoot()). */
    imports?: NonNullable<ModuleMetadata['imports']>;
    /** More providers for the app. */
    providers?: Provider[];
  } = {},
): Promise<SequenceTestApp> {
  const transport = (options.transport as InMemoryTransport | undefined) ?? new InMemoryTransport();
  const store = options.sequence?.store ?? new MemorySequenceStore();
  const { handler: handlerOptions, imports = [], providers = [], ...moduleOptions } = options;
  const Handler = recordingHandler({ channel, ...handlerOptions });
  const { app, close } = await createTestApp({
    sequence: mergeOptions<SequenceModuleOptions>(
      { tuning: { sweepers: { expiry: { intervalMs: false } }, backpressureDelayMs: 10 } },
      { ...moduleOptions, transport, sequence: { ...moduleOptions.sequence, store } },
    ),
    imports,
    providers: [Handler, ...providers],
    logger: false,
  });
  return {
    app,
    transport,
    store,
    handler: app.get(Handler),
    splitter: app.get(SplitterService),
    sweeper: app.get(ExpirySweeper),
    metrics: app.get(ModuleMetrics),
    close,
  };
}

/** One hand-made fragment: body plus contract headers, to publish in any order or corrupt. */
export interface TestFragment {
  body: Buffer;
  headers: HeaderMap;
}

/**
 * Cuts `payload` into fragments the way the splitter does (size known), so tests can shuffle,
 * duplicate, drop or corrupt them before publishing.
 */
export function makeFragments(
  sequenceId: string,
  payload: Buffer,
  fragmentBytes: number,
  userHeaders: HeaderMap = {},
): TestFragment[] {
  const size = Math.max(1, Math.ceil(payload.length / fragmentBytes));
  const sha256 = sha256Hex(payload);
  return Array.from({ length: size }, (_, index) => {
    const body = payload.subarray(index * fragmentBytes, (index + 1) * fragmentBytes);
    const position = index + 1;
    return {
      body,
      headers: buildFragmentHeaders({
        sequenceId,
        position,
        size,
        last: position === size,
        crc32: crc32(body),
        bytes: payload.length,
        sha256: position === size ? sha256 : undefined,
        userHeaders,
      }),
    };
  });
}

/** Fragment 1 of `size`, not the last, with a 100-byte body and `declaredBytes` for the whole. */
export function firstFragment(
  sequenceId: string,
  size: number,
  declaredBytes: number,
): TestFragment {
  const body = bytes(100, 16);
  const headers = buildFragmentHeaders({
    sequenceId,
    position: 1,
    size,
    last: false,
    crc32: crc32(body),
    bytes: declaredBytes,
  });
  return { body, headers };
}

export async function publishAll(
  transport: Transport,
  channel: string,
  fragments: readonly TestFragment[],
): Promise<void> {
  for (const { body, headers } of fragments) await transport.publish(channel, body, headers);
}

/**
 * Publishes fragments to their sequence's partition of `partitions`, as a producer with
 * `buffer: 'broker'` does.
 */
export async function publishHeld(
  transport: Transport,
  channel: string,
  fragments: readonly TestFragment[],
  partitions: number,
): Promise<void> {
  for (const { body, headers } of fragments) {
    const index = partitionIndex(String(headers['x-sequence-id']), partitions);
    await transport.publish(channel, body, headers, { partition: { index, count: partitions } });
  }
}

/** Polls `check` until it returns true; fails naming `what` after `timeoutMs`. */
export async function eventually(
  check: () => boolean | Promise<boolean>,
  what: string,
  timeoutMs = 5_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/** Messages waiting on a channel (e.g. a dead-letter channel), with their `x-death-reason`. */
export function deadLetters(transport: InMemoryTransport, channel: string): InboundMessage[] {
  return transport.peek(`${channel}.dlq`);
}

export function deathReasonOf(message: InboundMessage): string {
  return String(message.headers['x-death-reason']);
}

/** Deterministic pseudo-random bytes (tests must be reproducible). */
export function bytes(length: number, seed = 7): Buffer {
  const out = Buffer.allocUnsafe(length);
  let state = seed >>> 0 || 1;
  for (let i = 0; i < length; i++) {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    out[i] = state & 0xff;
  }
  return out;
}

/** One publish attempt seen by a {@link FaultInjectingTransport}. */
export interface PublishAttempt {
  readonly channel: string;
  /** `x-sequence-position` of the message, or 0 when it has none. */
  readonly position: number;
  /** 1 for the first attempt at this channel and position, 2 for its first retry, … */
  readonly attempt: number;
  /** `Date.now()` when the attempt started. */
  readonly at: number;
  readonly options?: PublishOptions;
}

/**
 * A {@link Transport} around a real one that injects publish faults. `beforePublish` runs before
 * each attempt reaches the inner transport and may throw (a nack), never settle (a lost confirm)
 * or await a gate (a slow broker). Faults strike before delegating, so a failed attempt leaves no
 * message behind and a retry cannot duplicate one. Subscriptions go straight to the inner transport.
 */
export class FaultInjectingTransport extends ForwardingTransport {
  readonly name = 'fault-injecting';
  /** Every publish attempt, in the order they started. */
  readonly attempts: PublishAttempt[] = [];
  /** Publishes started and not settled yet, and the most there ever were at once. */
  pending = 0;
  maxPending = 0;
  beforePublish: (attempt: PublishAttempt) => void | Promise<void> = () => undefined;

  /** The attempts at one position of one channel. */
  attemptsAt(channel: string, position: number): PublishAttempt[] {
    return this.attempts.filter((a) => a.channel === channel && a.position === position);
  }

  override async publish(
    channel: string,
    body: Buffer,
    headers: HeaderMap,
    options?: PublishOptions,
  ): Promise<void> {
    const position = Number(headers['x-sequence-position'] ?? 0);
    const attempt: PublishAttempt = {
      channel,
      position,
      attempt: this.attemptsAt(channel, position).length + 1,
      at: Date.now(),
      options,
    };
    this.attempts.push(attempt);
    this.pending++;
    this.maxPending = Math.max(this.maxPending, this.pending);
    try {
      await this.beforePublish(attempt);
      await this.inner.publish(channel, body, headers, options);
    } finally {
      this.pending--;
    }
  }
}

/**
 * Like {@link makeFragments}, but in streaming mode: only the last fragment carries the size and
 * the byte count, as the splitter does for a stream of unknown length.
 */
export function makeStreamingFragments(
  sequenceId: string,
  payload: Buffer,
  fragmentBytes: number,
  userHeaders: HeaderMap = {},
): TestFragment[] {
  return makeFragments(sequenceId, payload, fragmentBytes, userHeaders).map(({ body, headers }) => {
    if (headers['x-sequence-last'] === true) return { body, headers };
    const { ['x-sequence-size']: _size, ['x-sequence-bytes']: _bytes, ...rest } = headers;
    return { body, headers: rest };
  });
}

/** A deterministic shuffle (Fisher-Yates over a xorshift generator): a new array. */
export function shuffled<T>(items: readonly T[], seed = 11): T[] {
  const out = [...items];
  let state = seed >>> 0 || 1;
  for (let i = out.length - 1; i > 0; i--) {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    const j = (state >>> 0) % (i + 1);
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}

/**
 * The value of one sample in `registry`: a counter or gauge by its name, a histogram's
 * `<name>_count` / `<name>_sum`, summed over the series whose labels include `labels`. Throws if
 * no registered metric has that name, so a misspelt name cannot pass as 0.
 */
export async function metricValue(
  registry: Registry,
  sampleName: string,
  labels: Record<string, string> = {},
): Promise<number> {
  const metrics = await registry.getMetricsAsJSON();
  const samples = metrics.flatMap((metric) =>
    // Histogram samples name themselves (`<name>_count`, …); prom-client's type omits it here.
    metric.values.map((value: { value: number; labels: object; metricName?: string }) => ({
      value: value.value,
      labels: value.labels as Record<string, string | number | undefined>,
      name: value.metricName ?? metric.name,
    })),
  );
  if (
    !metrics.some(
      (metric) => sampleName === metric.name || sampleName.startsWith(`${metric.name}_`),
    )
  ) {
    throw new Error(`no metric ${sampleName} in the registry`);
  }
  return samples
    .filter(
      (sample) =>
        sample.name === sampleName &&
        Object.entries(labels).every(([name, value]) => sample.labels[name] === value),
    )
    .reduce((sum, sample) => sum + sample.value, 0);
}
