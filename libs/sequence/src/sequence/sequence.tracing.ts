import { headerText, readInteger, SEQUENCE_ID_PATTERN, SequenceHeader } from '../core/headers';
import type { CompleteSequence } from '../ports/sequence-store.port';
import type { Disposition, InboundMessage } from '../ports/transport.port';
import type { ResolvedTracing } from '../options/resolved-options';
import type { OtelSpanContext } from '../kernel/tracing/otel-api';
import {
  carriedParent,
  inSpan,
  messagingAttributes,
  type TraceSpan,
} from '../kernel/tracing/message-spans';

/** Sequences at once whose fragments' receive spans this instance remembers, for links. */
const REMEMBERED_SEQUENCES = 1024;

/**
 * Message Sequence's spans: `send` per sequence (producer; one event per fragment published),
 * `receive` per fragment (consumer, linked to `send`), `process` per delivered sequence (the
 * handler; linked to `send` and to the `receive` spans of the fragments this instance took, up
 * to `tracing.maxLinks`).
 */
export class SequenceTracing {
  /** Receive spans per `<channel> <sequence id>`, oldest sequence first. */
  private readonly received = new Map<string, OtelSpanContext[]>();

  constructor(private readonly tracing: ResolvedTracing) {}

  send<T>(channel: string, sequenceId: string, work: (span: TraceSpan) => Promise<T>): Promise<T> {
    return inSpan(
      this.tracing,
      {
        name: `send ${channel}`,
        kind: 'producer',
        attributes: messagingAttributes({
          operation: 'send',
          destination: channel,
          messageId: sequenceId,
          conversationId: sequenceId,
        }),
      },
      work,
    );
  }

  /** Marks a fragment's publish on the active `send` span. */
  static published(span: TraceSpan, position: number, bytes: number, attempts: number): void {
    if (!span.recording) return;
    span.event('fragment published', {
      'nest_sequence.fragment.position': position,
      'messaging.message.body.size': bytes,
      'nest_sequence.publish.attempts': attempts,
    });
  }

  receive(
    message: InboundMessage,
    channel: string,
    work: () => Promise<Disposition>,
  ): Promise<Disposition> {
    const headers = message.headers ?? {};
    // Read before the fragment's checks: only what the wire contract allows is recorded, or
    // remembered for the process span's links (another program may send any header).
    const sequenceId = sequenceIdOf(headers[SequenceHeader.id]);
    const position = positionOf(headers[SequenceHeader.position]);
    return inSpan(
      this.tracing,
      {
        name: `receive ${channel}`,
        kind: 'consumer',
        parent: carriedParent(this.tracing),
        carriers: [headers],
        attributes: {
          ...messagingAttributes({
            operation: 'receive',
            destination: channel,
            messageId:
              sequenceId && position !== undefined ? `${sequenceId}:${position}` : undefined,
            conversationId: sequenceId,
            bodyBytes: message.body?.length,
          }),
          'nest_sequence.fragment.position': position,
          'nest_sequence.redelivered': message.redelivered,
        },
      },
      async (span) => {
        const context = span.context();
        if (span.recording && context && sequenceId) this.remember(channel, sequenceId, context);
        return work();
      },
    );
  }

  process(
    channel: string,
    sequence: CompleteSequence,
    completedBy: InboundMessage,
    work: () => Promise<Disposition>,
  ): Promise<Disposition> {
    const key = `${channel} ${sequence.sequenceId}`;
    const fragments = this.received.get(key) ?? [];
    this.received.delete(key);
    return inSpan(
      this.tracing,
      {
        name: `process ${channel}`,
        kind: 'consumer',
        parent: carriedParent(this.tracing, 'outer'),
        carriers: [completedBy.headers ?? {}],
        links: fragments,
        attributes: {
          ...messagingAttributes({
            operation: 'process',
            destination: channel,
            messageId: sequence.sequenceId,
            conversationId: sequence.sequenceId,
            bodyBytes: sequence.declaredBytes ?? sequence.bytes,
            batchCount: sequence.fragments,
          }),
          'nest_sequence.sequence.fragments': sequence.fragments,
          'nest_sequence.sequence.wait_ms': Math.max(0, Date.now() - sequence.firstFragmentAt),
        },
      },
      () => work(),
    );
  }

  private remember(channel: string, sequenceId: string, context: OtelSpanContext): void {
    const key = `${channel} ${sequenceId}`;
    let contexts = this.received.get(key);
    if (!contexts) {
      if (this.received.size >= REMEMBERED_SEQUENCES) {
        const oldest = this.received.keys().next();
        if (!oldest.done) this.received.delete(oldest.value);
      }
      contexts = [];
      this.received.set(key, contexts);
    }
    // One link is kept for the producer's span.
    if (contexts.length < this.tracing.maxLinks - 1) contexts.push(context);
  }
}

function sequenceIdOf(value: unknown): string | undefined {
  const text = headerText(value);
  return text !== undefined && SEQUENCE_ID_PATTERN.test(text) ? text : undefined;
}

function positionOf(value: unknown): number | undefined {
  const position = readInteger(value);
  return position !== undefined && position >= 1 ? position : undefined;
}
