import { randomUUID } from 'node:crypto';
import { Injectable, type INestApplicationContext } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { SpanKind, trace } from '@opentelemetry/api';
import {
  ReassembledPayload,
  SequencedHandler,
  SequenceModule,
  SplitterService,
  type SequenceModuleOptions,
} from 'nest-sequence';
import { RabbitMqTransport } from 'nest-sequence/rabbitmq';
import { describeWithServer } from '../support/servers';
import { AMQP_URL, silentLogger, useRabbitMq } from '../support/rabbitmq.fixture';
import { bytes, eventually } from '../support/sequence-test-app';
import { connectedTo, idOf, named, useInMemoryTracing } from './in-memory-tracing';

jest.setTimeout(120_000);

const MiB = 1024 * 1024;

/**
 * A 30 MB sequence over RabbitMQ, traced: one `send` span for the sequence, a `receive` span per
 * fragment linked to it, and the handler running in a `process` span linked to both.
 */
describeWithServer('rabbitmq', 'tracing: Message Sequence over RabbitMQ', () => {
  const tracing = useInMemoryTracing();
  const rabbit = useRabbitMq();
  const opened: Array<() => Promise<void>> = [];
  afterEach(async () => {
    for (const close of opened.splice(0).reverse()) await close();
  });

  async function start(channel: string, options: SequenceModuleOptions = {}) {
    const seen: Array<{ spanId?: string; bytes: number }> = [];
    @Injectable()
    class Handler {
      @SequencedHandler({ channel })
      async handle(payload: ReassembledPayload): Promise<void> {
        const spanId = trace.getActiveSpan()?.spanContext().spanId;
        const body = await payload.toBuffer();
        seen.push({ spanId, bytes: body.length });
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
          ...options,
        }),
      ],
      providers: [Handler],
    }).compile();
    moduleRef.useLogger(false);
    const app: INestApplicationContext = await moduleRef.init();
    opened.push(() => app.close());
    return { splitter: app.get(SplitterService), seen };
  }

  it('links every receive span and the handler’s process span to the one send span (link mode, the default)', async () => {
    const channel = rabbit.admin.newChannel();
    const { splitter, seen } = await start(channel);
    const payload = bytes(30 * MiB, 26);

    const receipt = await splitter.send(channel, payload, {
      sequenceId: `traced-${randomUUID()}`,
      fragmentBytes: MiB,
    });
    await eventually(() => seen.length === 1, 'the handler to run', 60_000);

    const spans = tracing.moduleSpans();
    const [send] = named(spans, `send ${channel}`);
    expect(send.kind).toBe(SpanKind.PRODUCER);
    expect(send.attributes).toMatchObject({
      'messaging.system': 'nest-sequence',
      'messaging.destination.name': channel,
      'messaging.operation.type': 'send',
      'messaging.message.conversation_id': receipt.sequenceId,
      'messaging.batch.message_count': 30,
    });
    expect(send.events.filter((e) => e.name === 'fragment published')).toHaveLength(30);

    const receives = named(spans, `receive ${channel}`);
    expect(receives).toHaveLength(30);
    for (const receive of receives) {
      expect(receive.kind).toBe(SpanKind.CONSUMER);
      expect(receive.attributes['messaging.message.conversation_id']).toBe(receipt.sequenceId);
      // Linked, not parented: each fragment's span starts a trace of its own.
      expect(receive.links.map((link) => idOf(link.context))).toEqual([idOf(send.spanContext())]);
      expect(receive.spanContext().traceId).not.toBe(send.spanContext().traceId);
    }

    const [process] = named(spans, `process ${channel}`);
    expect(process.attributes).toMatchObject({
      'messaging.operation.type': 'process',
      'messaging.message.conversation_id': receipt.sequenceId,
      'nest_sequence.sequence.fragments': 30,
    });
    // The handler ran inside it.
    expect(seen[0]).toEqual({ spanId: process.spanContext().spanId, bytes: payload.length });
    // Linked to the send span and to the receive spans, up to maxLinks (32) in all.
    const links = process.links.map((link) => idOf(link.context));
    expect(links).toContain(idOf(send.spanContext()));
    expect(links).toHaveLength(30 + 1);
    for (const receive of receives) expect(links).toContain(idOf(receive.spanContext()));

    // One connected trace, from send to the handler's span.
    const reachable = connectedTo(send, spans);
    for (const span of [process, ...receives]) {
      expect(reachable.has(idOf(span.spanContext()))).toBe(true);
    }
  });

  it("puts send, receives and the handler's span in one trace with parent: 'child'", async () => {
    const channel = rabbit.admin.newChannel();
    const { splitter, seen } = await start(channel, { tracing: { parent: 'child', maxLinks: 4 } });

    await splitter.send(channel, bytes(30 * MiB, 27), { fragmentBytes: MiB });
    await eventually(() => seen.length === 1, 'the handler to run', 60_000);

    const spans = tracing.moduleSpans();
    const [send] = named(spans, `send ${channel}`);
    const receives = named(spans, `receive ${channel}`);
    const [process] = named(spans, `process ${channel}`);
    expect(receives).toHaveLength(30);
    for (const span of [...receives, process]) {
      expect(span.spanContext().traceId).toBe(send.spanContext().traceId);
      expect(span.parentSpanContext?.spanId).toBe(send.spanContext().spanId);
    }
    // The cap: maxLinks links at most (here the fragments' receive spans only).
    expect(process.links.length).toBeLessThanOrEqual(4);
    expect(seen[0].spanId).toBe(process.spanContext().spanId);
  });
});
