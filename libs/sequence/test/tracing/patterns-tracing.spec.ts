import { randomUUID } from 'node:crypto';
import { context, SpanKind, trace } from '@opentelemetry/api';
import { ClaimCheckService } from 'nest-sequence';
import {
  createOutboxTestApp,
  FAST_BOX,
  inboxHandler,
  type OutboxTestApp,
} from '../outbox/outbox-test-app';
import {
  createResequencerTestApp,
  publishEvent,
  type ResequencerTestApp,
} from '../resequencer/resequencer-test-app';
import { createTestApp } from '../support/test-app';
import { createClaimCheckTestApp } from '../claim-check/claim-check-test-app';
import { eventually } from '../support/sequence-test-app';
import { idOf, named, useInMemoryTracing } from './in-memory-tracing';

const OrderPlaced = inboxHandler({ event: 'OrderPlaced' });

describe('tracing: Outbox, Inbox, Resequencer and Claim Check (in-memory broker)', () => {
  const tracing = useInMemoryTracing();
  const closing: Array<() => Promise<void>> = [];
  afterEach(async () => {
    for (const close of closing.splice(0).reverse()) await close();
  });

  it("links an outbox commit in the caller's trace, the relay's publish, and the inbox handler", async () => {
    const t: OutboxTestApp = await createOutboxTestApp(
      { outboxEvents: FAST_BOX, inboxEvents: FAST_BOX },
      [OrderPlaced],
    );
    closing.push(() => t.close());
    const tracer = trace.getTracer('test');
    const request = tracer.startSpan('POST /orders');
    const id = await context.with(trace.setSpan(context.active(), request), () =>
      t.outbox.transaction(async (tx) =>
        tx.publishEvent({
          type: 'OrderPlaced',
          aggregateType: 'Order',
          aggregateId: randomUUID(),
          payload: { total: 42 },
        }),
      ),
    );
    request.end();
    // The record keeps the context of the transaction that wrote it.
    const stored = await t.outbox.record('outbox_events', id);
    const handler = t.handler(OrderPlaced);
    await eventually(() => handler.calls.length === 1, 'the inbox handler to run');
    await t.runtime.idle();

    const spans = tracing.moduleSpans();
    const [create] = named(spans, 'create outbox');
    expect(create.parentSpanContext?.spanId).toBe(request.spanContext().spanId);
    expect(create.spanContext().traceId).toBe(request.spanContext().traceId);
    expect(stored?.headers['x-message-traceparent']).toBe(
      `00-${create.spanContext().traceId}-${create.spanContext().spanId}-01`,
    );

    const [send] = named(spans, 'send events.OrderPlaced');
    expect(send.kind).toBe(SpanKind.PRODUCER);
    expect(send.attributes).toMatchObject({
      'messaging.operation.type': 'send',
      'messaging.message.id': id,
      'nest_sequence.outbox.box': 'outbox_events',
    });
    expect(send.links.map((link) => idOf(link.context))).toEqual([idOf(create.spanContext())]);

    const [process] = named(spans, 'process events.OrderPlaced');
    expect(process.kind).toBe(SpanKind.CONSUMER);
    expect(process.attributes['nest_sequence.outbox.box']).toBe('inbox_events');
    expect(process.links.map((link) => idOf(link.context))).toEqual([idOf(send.spanContext())]);
  });

  it('shows on the release span how long an event waited for its gap', async () => {
    const channel = `traced.transfers.${randomUUID()}`;
    const t: ResequencerTestApp = await createResequencerTestApp({
      channel,
      gap: { timeoutMs: 60_000, policy: 'alert' },
    });
    closing.push(() => t.close());

    await publishEvent(t.transport, channel, 'T1', 2);
    await eventually(
      async () => (await t.service.buffered(channel, 'T1')).length === 1,
      'event 2 held',
    );
    const waited = 50;
    await new Promise((resolve) => setTimeout(resolve, waited));
    await publishEvent(t.transport, channel, 'T1', 1);
    await eventually(() => t.handler.received.length === 2, 'both events');
    // The handler does not see the resequencer's own bookkeeping header.
    for (const event of t.handler.received) {
      expect(event.headers).not.toHaveProperty('x-resequence-held-at');
    }

    const spans = tracing.moduleSpans();
    const holds = named(spans, `hold ${channel}`);
    expect(holds).toHaveLength(2);
    const releases = named(spans, `release ${channel}`);
    const bySeq = new Map(releases.map((s) => [s.attributes['nest_sequence.resequencer.seq'], s]));
    const second = bySeq.get(2)!;
    expect(second.attributes['nest_sequence.resequencer.held_ms']).toBeGreaterThanOrEqual(waited);
    expect(bySeq.get(1)!.attributes['nest_sequence.resequencer.held_ms']).toEqual(
      expect.any(Number),
    );
    // The release links to the hold span of its event.
    const holdOf2 = holds.find((s) => s.attributes['nest_sequence.resequencer.seq'] === 2)!;
    expect(second.links.map((link) => idOf(link.context))).toEqual([idOf(holdOf2.spanContext())]);
  });

  it("with parent: 'child', makes each release a child of its own event's hold, not of the one that released it", async () => {
    const channel = `traced.child.${randomUUID()}`;
    const t: ResequencerTestApp = await createResequencerTestApp(
      { channel, gap: { timeoutMs: 60_000, policy: 'alert' } },
      { tracing: { parent: 'child' } },
    );
    closing.push(() => t.close());

    // Event 2 is held; event 1, from another request, releases both.
    await publishEvent(t.transport, channel, 'T1', 2);
    await eventually(
      async () => (await t.service.buffered(channel, 'T1')).length === 1,
      'event 2 held',
    );
    await publishEvent(t.transport, channel, 'T1', 1);
    await eventually(() => t.handler.received.length === 2, 'both events');

    const spans = tracing.moduleSpans();
    const holdOf = (seq: number) =>
      named(spans, `hold ${channel}`).find(
        (s) => s.attributes['nest_sequence.resequencer.seq'] === seq,
      )!;
    const releaseOf = (seq: number) =>
      named(spans, `release ${channel}`).find(
        (s) => s.attributes['nest_sequence.resequencer.seq'] === seq,
      )!;
    for (const seq of [1, 2]) {
      expect(releaseOf(seq).parentSpanContext?.spanId).toBe(holdOf(seq).spanContext().spanId);
      expect(releaseOf(seq).spanContext().traceId).toBe(holdOf(seq).spanContext().traceId);
    }
  });

  it("traces a check-in, and a check-out linked to the context the ticket's message carried", async () => {
    const { app, close } = await createTestApp({ sequence: {}, logger: false });
    closing.push(close);
    const claimCheck = app.get(ClaimCheckService);

    const ticket = await claimCheck.checkIn(Buffer.alloc(1024, 7));
    const [checkIn] = named(tracing.moduleSpans(), 'check-in');
    expect(checkIn.attributes['nest_sequence.claim_check.bytes']).toBe(1024);

    const carrier = {
      'x-message-traceparent': `00-${checkIn.spanContext().traceId}-${checkIn.spanContext().spanId}-01`,
    };
    const payload = await claimCheck.checkOut(ticket, carrier);
    expect((await payload.toBuffer()).length).toBe(1024);
    const [checkOut] = named(tracing.moduleSpans(), 'check-out');
    expect(checkOut.links.map((link) => idOf(link.context))).toEqual([idOf(checkIn.spanContext())]);
  });

  it("links a claim ticket's check-out, where its handler runs, to the publisher's send span", async () => {
    const t = await createClaimCheckTestApp({ claimCheck: { inlineMaxBytes: 0 } });
    closing.push(() => t.close());
    let handlerSpan: string | undefined;
    t.handler.onCall = async () => {
      handlerSpan = trace.getActiveSpan()?.spanContext().spanId;
    };

    const receipt = await t.claimCheck.publish(t.channel, Buffer.alloc(4096, 3));
    expect(receipt.via).toBe('ticket');
    await eventually(() => t.handler.deliveries.length === 1, 'the handler to run');
    // The check-out span ends once the handler has returned, a little after its delivery.
    await eventually(
      () => named(tracing.moduleSpans(), 'check-out').length === 1,
      'the check-out span to end',
    );

    const spans = tracing.moduleSpans();
    const [send] = named(spans, `send ${t.channel}`);
    expect(send.attributes['nest_sequence.claim_check.via']).toBe('ticket');
    const [checkIn] = named(spans, 'check-in');
    expect(checkIn.parentSpanContext?.spanId).toBe(send.spanContext().spanId);
    const [checkOut] = named(spans, 'check-out');
    expect(checkOut.attributes['messaging.destination.name']).toBe(t.channel);
    expect(checkOut.links.map((link) => idOf(link.context))).toEqual([idOf(send.spanContext())]);
    expect(handlerSpan).toBe(checkOut.spanContext().spanId);
  });
});
