import { Injectable, type INestApplicationContext, type Type } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  ExpirySweeper,
  InMemoryTransport,
  MemorySequenceStore,
  ReassembledPayload,
  SequenceMetrics,
  SequenceModule,
  SequencedHandler,
  SplitterService,
  buildFragmentHeaders,
  type HeaderMap,
  type InboundMessage,
  type SequenceModuleOptions,
  type SequenceStore,
  type SequencedHandlerOptions,
  type Transport,
} from 'nest-sequence';
import { crc32, sha256Hex } from '../../src/core/checksum';

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
    override async handle(payload: ReassembledPayload): Promise<void> {
      await super.handle(payload);
    }
  }
  return Handler;
}

export class RecordingHandler {
  readonly deliveries: Delivery[] = [];
  calls = 0;
  /** Number of upcoming calls that throw. */
  failNext = 0;

  async handle(payload: ReassembledPayload): Promise<void> {
    this.calls++;
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
  readonly metrics: SequenceMetrics;
  close(): Promise<void>;
}

/**
 * A Nest application with SequenceModule and one recording `@SequencedHandler` on `channel`.
 * Pass a shared `transport` / `store` to run several instances against the same ones (each test
 * closes what it created). The sweeper's timer is off unless `sweepIntervalMs` is given: tests
 * call `sweeper.sweep(now)` themselves.
 */
export async function createSequenceTestApp(
  channel: string,
  options: SequenceModuleOptions & { handler?: Omit<SequencedHandlerOptions, 'channel'> } = {},
): Promise<SequenceTestApp> {
  const transport = (options.transport as InMemoryTransport | undefined) ?? new InMemoryTransport();
  const store = options.store ?? new MemorySequenceStore();
  const { handler: handlerOptions, ...moduleOptions } = options;
  const Handler = recordingHandler({ channel, ...handlerOptions });
  const moduleRef = await Test.createTestingModule({
    imports: [
      SequenceModule.forRoot({
        sweepIntervalMs: false,
        backpressureDelayMs: 10,
        ...moduleOptions,
        transport,
        store,
      }),
    ],
    providers: [Handler],
  }).compile();
  moduleRef.useLogger(false);
  const app = await moduleRef.init();
  return {
    app,
    transport,
    store,
    handler: app.get(Handler),
    splitter: app.get(SplitterService),
    sweeper: app.get(ExpirySweeper),
    metrics: app.get(SequenceMetrics),
    close: () => app.close(),
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

export async function publishAll(
  transport: Transport,
  channel: string,
  fragments: readonly TestFragment[],
): Promise<void> {
  for (const { body, headers } of fragments) await transport.publish(channel, body, headers);
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
