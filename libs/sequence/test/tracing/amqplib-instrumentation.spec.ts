import { Injectable, type INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { SpanKind, trace } from '@opentelemetry/api';
import { AmqplibInstrumentation } from '@opentelemetry/instrumentation-amqplib';
import {
  ReassembledPayload,
  SequencedHandler,
  SequenceModule,
  SplitterService,
} from 'nest-sequence';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { describeWithServer } from '../support/servers';
import { AMQP_URL, silentLogger, useRabbitMq } from '../support/rabbitmq.fixture';
import { bytes, eventually } from '../support/sequence-test-app';
import { connectedTo, idOf, named, useInMemoryTracing } from './in-memory-tracing';

jest.setTimeout(120_000);

const MiB = 1024 * 1024;

/**
 * With @opentelemetry/instrumentation-amqplib on, which writes its own publish span into every
 * message's `traceparent`: the module's spans still connect, through `x-message-traceparent`, and
 * it adds one span per sequence, not one per fragment, on the producer's side.
 */
describeWithServer('rabbitmq', 'tracing: beside the amqplib instrumentation', () => {
  const tracing = useInMemoryTracing();
  const rabbit = useRabbitMq();
  const instrumentation = new AmqplibInstrumentation({ enabled: false });
  // Jest's module registry bypasses require hooks: patch the module amqplib itself loads.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const channelModel = require('amqplib/lib/channel_model.js') as object;
  const patcher = instrumentation as unknown as {
    patchChannelModel(exports: object, version: string): object;
    unpatchChannelModel(exports: object): object;
  };
  const opened: Array<() => Promise<void>> = [];

  beforeAll(() => {
    instrumentation.setTracerProvider(tracing.provider);
    patcher.patchChannelModel(channelModel, '0.10.9');
  });
  afterAll(() => patcher.unpatchChannelModel(channelModel));
  afterEach(async () => {
    for (const close of opened.splice(0).reverse()) await close();
  });

  it("still links the fragments' and the handler's spans to the sequence's send span", async () => {
    const channel = rabbit.admin.newChannel();
    const seen: Array<string | undefined> = [];
    @Injectable()
    class Handler {
      @SequencedHandler({ channel })
      async handle(payload: ReassembledPayload): Promise<void> {
        await payload.toBuffer();
        seen.push(trace.getActiveSpan()?.spanContext().spanId);
      }
    }
    const transport = await RabbitMqTransport.connect(AMQP_URL, {}, { logger: silentLogger });
    opened.push(() => transport.close());
    const moduleRef = await Test.createTestingModule({
      imports: [
        SequenceModule.forRoot({
          transport,
          metrics: false,
          tuning: { sweepers: { expiry: { intervalMs: false } } },
        }),
      ],
      providers: [Handler],
    }).compile();
    moduleRef.useLogger(false);
    const app: INestApplicationContext = await moduleRef.init();
    opened.push(() => app.close());

    await app.get(SplitterService).send(channel, bytes(4 * MiB, 31), { fragmentBytes: MiB });
    await eventually(() => seen.length === 1, 'the handler to run', 60_000);

    const all = tracing.spans();
    const instrumented = all.filter(
      (span) => span.instrumentationScope.name === '@opentelemetry/instrumentation-amqplib',
    );
    // The instrumentation did its part: a publish span per fragment, under the module's send.
    const [send] = named(all, `send ${channel}`);
    const publishes = instrumented.filter((span) => span.kind === SpanKind.PRODUCER);
    expect(publishes.length).toBeGreaterThanOrEqual(4);
    for (const publish of publishes.filter(
      (p) => p.attributes['messaging.rabbitmq.routing_key'] === channel,
    )) {
      expect(publish.parentSpanContext?.spanId).toBe(send.spanContext().spanId);
    }
    // Its consumer spans continue the `traceparent` it wrote: its own publish spans.
    const publishIds = new Set(publishes.map((p) => p.spanContext().spanId));
    const consumes = instrumented.filter((span) => span.kind === SpanKind.CONSUMER);
    expect(consumes.length).toBeGreaterThanOrEqual(4);
    for (const consume of consumes) {
      expect(publishIds.has(consume.parentSpanContext?.spanId ?? '')).toBe(true);
    }
    // One module span on the producer side for the four fragments.
    expect(named(all, `send ${channel}`)).toHaveLength(1);

    // Each receive span links to the send span, not to the instrumentation's publish span that
    // the fragment's `traceparent` names.
    const receives = named(all, `receive ${channel}`);
    expect(receives).toHaveLength(4);
    for (const receive of receives) {
      expect(receive.links.map((link) => idOf(link.context))).toContain(idOf(send.spanContext()));
    }
    const [process] = named(all, `process ${channel}`);
    expect(seen[0]).toBe(process.spanContext().spanId);
    const reachable = connectedTo(send, all);
    for (const span of [process, ...receives]) {
      expect(reachable.has(idOf(span.spanContext()))).toBe(true);
    }
  });
});
