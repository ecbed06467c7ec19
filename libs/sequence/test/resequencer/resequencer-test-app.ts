import {
  Injectable,
  type INestApplicationContext,
  type ModuleMetadata,
  type Type,
} from '@nestjs/common';
import { GapSweeper } from '../../src/resequencer/gap.sweeper';
import {
  InMemoryTransport,
  Resequenced,
  ResequencerService,
  type GapEvent,
  type HandlerContext,
  type ResequencedEvent,
  type ResequencerDefinition,
  type SequenceModuleOptions,
  type Transport,
} from 'nest-sequence';
import { ModuleMetrics } from '../../src/kernel/module-metrics';
import { type HeaderMap } from 'nest-sequence/wire';
import { mergeOptions } from '../support/merge-options';
import { createTestApp } from '../support/test-app';

/** What a test handler received, in call order. */
export interface Received {
  readonly key: string;
  readonly seq: number;
  readonly body: string;
  readonly headers: Readonly<Record<string, unknown>>;
}

/** A `@Resequenced` handler for tests: records every call; can be told to fail, or to wait. */
export class RecordingResequencedHandler {
  readonly received: Received[] = [];
  /** Events (`key:seq`) whose calls throw, every time. */
  readonly failing = new Set<string>();
  /**
   * Awaited at the start of every call, before it is recorded (e.g. to hold the handler mid-call,
   * or to see its signal); what it throws fails the call.
   */
  onCall?: (event: ResequencedEvent, context: HandlerContext) => Promise<void>;

  handle(event: ResequencedEvent, context: HandlerContext): void | Promise<void> {
    if (!this.onCall) return this.record(event);
    return this.onCall(event, context).then(() => this.record(event));
  }

  private record(event: ResequencedEvent): void {
    if (this.failing.has(`${event.key}:${event.seq}`)) {
      throw new Error(`handler failure on ${event.key}:${event.seq} (expected by the test)`);
    }
    this.received.push({
      key: event.key,
      seq: event.seq,
      body: event.text(),
      headers: event.headers,
    });
  }

  /** The sequences received for `key`, in call order. */
  of(key: string): number[] {
    return this.received.filter((each) => each.key === key).map((each) => each.seq);
  }
}

/** A provider class whose `handle` method carries `@Resequenced(definition)`. */
export function resequencedHandler(
  definition: ResequencerDefinition,
): Type<RecordingResequencedHandler> {
  @Injectable()
  class Handler extends RecordingResequencedHandler {
    @Resequenced(definition)
    override handle(event: ResequencedEvent, context: HandlerContext): void | Promise<void> {
      return super.handle(event, context);
    }
  }
  return Handler;
}

export interface ResequencerTestApp {
  readonly app: INestApplicationContext;
  readonly transport: InMemoryTransport;
  readonly handler: RecordingResequencedHandler;
  readonly service: ResequencerService;
  readonly sweeper: GapSweeper;
  readonly gaps: GapEvent[];
  readonly metrics: ModuleMetrics;
  close(): Promise<void>;
}

/** An application with one `@Resequenced` handler on the embedded defaults (or given adapters). */
export async function createResequencerTestApp(
  definition: ResequencerDefinition,
  options: SequenceModuleOptions = {},
  /** Other modules of the app (e.g. `ScheduleModule.forRoot()`). */
  imports: NonNullable<ModuleMetadata['imports']> = [],
): Promise<ResequencerTestApp> {
  const transport = (options.transport as InMemoryTransport | undefined) ?? new InMemoryTransport();
  const Handler = resequencedHandler(definition);
  const gaps: GapEvent[] = [];
  const { app, close } = await createTestApp({
    importsBefore: imports,
    sequence: mergeOptions<SequenceModuleOptions>(
      { tuning: { sweepers: { gaps: { intervalMs: false } } } },
      { ...options, transport },
    ),
    providers: [Handler],
    // A transport the caller passed is the caller's to close.
    resources: options.transport ? [] : [() => transport.close()],
  });
  const service = app.get(ResequencerService);
  service.onGap((event) => void gaps.push(event));
  return {
    app,
    transport,
    handler: app.get(Handler),
    service,
    sweeper: app.get(GapSweeper),
    gaps,
    metrics: app.get(ModuleMetrics),
    close,
  };
}

/** Publishes one event with the default key and sequence headers. */
export function publishEvent(
  transport: Transport,
  channel: string,
  key: string,
  seq: number,
  body = `${key}#${seq}`,
  headers: HeaderMap = {},
): Promise<void> {
  return transport.publish(channel, Buffer.from(body), {
    ...headers,
    'x-resequence-key': key,
    'x-resequence-seq': seq,
  });
}
