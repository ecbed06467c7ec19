import type { HeaderMap } from '../core/headers';
import type { BoxName, StoredRecord } from '../ports/outbox-store.port';
import type { ResolvedTracing } from '../options/resolved-options';
import {
  carriedParent,
  inSpan,
  messagingAttributes,
  NOT_RECORDING,
  spansMatter,
  withTraceHeaders,
  type TraceSpan,
} from '../kernel/tracing/message-spans';

/**
 * Outbox and Inbox spans. Appending runs in a `create` span of the caller's trace, and each
 * record keeps the trace context active when it was written (in its headers); the relay's `send`
 * span links to it (or is its child), and the inbox handler's `process` span links to the
 * context the message arrived with.
 */
export const OutboxTracing = {
  /** `create outbox`: a transaction, or one record written outside `transaction()`. */
  append<T>(tracing: ResolvedTracing, what: string, work: () => Promise<T>): Promise<T> {
    // Per transaction: no attributes built for a span that would record nothing.
    if (!spansMatter(tracing)) return work();
    return inSpan(
      tracing,
      {
        name: 'create outbox',
        kind: 'producer',
        attributes: {
          ...messagingAttributes({ operation: 'create' }),
          'nest_sequence.outbox.write': what,
        },
      },
      () => work(),
    );
  },

  /**
   * The headers a new record keeps: the caller's, plus the active trace context (that of the
   * transaction writing it).
   */
  recordHeaders(headers: Readonly<Record<string, string>>): Record<string, string> {
    return withTraceHeaders(headers) as Record<string, string>;
  },

  /** `send <channel>` of one record, linked to the context it was written in. */
  relay<T>(
    tracing: ResolvedTracing,
    box: BoxName,
    record: StoredRecord,
    channels: readonly string[],
    work: (traced: (headers: HeaderMap) => HeaderMap, span: TraceSpan) => Promise<T>,
  ): Promise<T> {
    const parent = carriedParent(tracing);
    // Per message: no attributes built for a span that would record nothing.
    if (!spansMatter(tracing, parent)) return work(withTraceHeaders, NOT_RECORDING);
    return inSpan(
      tracing,
      {
        name: `send ${channels.join(',')}`,
        kind: 'producer',
        parent,
        carriers: [record.headers],
        attributes: {
          ...messagingAttributes({
            operation: 'send',
            destination: channels.join(','),
            messageId: record.id,
            bodyBytes: Buffer.byteLength(record.body),
          }),
          'nest_sequence.outbox.box': box,
          'nest_sequence.outbox.type': record.type,
          'nest_sequence.outbox.attempt': record.attempts + 1,
        },
      },
      (span) => work(withTraceHeaders, span),
    );
  },

  /** `process <channel>` of one inbox record: its handler's call. */
  process<T>(
    tracing: ResolvedTracing,
    box: BoxName,
    channel: string,
    record: StoredRecord,
    work: () => Promise<T>,
  ): Promise<T> {
    return inSpan(
      tracing,
      {
        name: `process ${channel}`,
        kind: 'consumer',
        parent: carriedParent(tracing),
        carriers: [record.headers],
        attributes: {
          ...messagingAttributes({
            operation: 'process',
            destination: channel,
            messageId: record.id,
            bodyBytes: Buffer.byteLength(record.body),
          }),
          'nest_sequence.outbox.box': box,
          'nest_sequence.outbox.type': record.type,
          'nest_sequence.outbox.attempt': record.attempts + 1,
        },
      },
      () => work(),
    );
  },
};
