import type { HeaderMap } from '../core/headers';
import type { ResequencedEntry } from '../ports/resequencer-store.port';
import type { Disposition } from '../ports/transport.port';
import type { ResolvedTracing } from '../options/resolved-options';
import {
  carriedParent,
  inSpan,
  NOT_RECORDING,
  messagingAttributes,
  spansMatter,
  withTraceHeaders,
  type TraceSpan,
} from '../kernel/tracing/message-spans';

/**
 * When the resequencer took an event (ms since the epoch), kept with the event while it waits
 * for its turn, and only while its spans are recorded: the `release` span reports the wait.
 * Never sent on: the output and the handler get the event's headers without it.
 */
export const HELD_AT_HEADER = 'x-resequence-held-at';

/**
 * Resequencer spans: `hold <name>` when an event is taken (linked to its producer), and
 * `release <name>` when it is delivered in order (linked to its hold span), with the milliseconds
 * it waited for its gap to close in `nest_sequence.resequencer.held_ms`.
 */
export class ResequencerTracing {
  constructor(
    private readonly tracing: ResolvedTracing,
    private readonly name: string,
  ) {}

  hold(
    headers: Readonly<Record<string, unknown>>,
    work: (span: TraceSpan) => Promise<Disposition>,
  ): Promise<Disposition> {
    const parent = carriedParent(this.tracing);
    if (!spansMatter(this.tracing, parent)) return work(NOT_RECORDING);
    return inSpan(
      this.tracing,
      {
        name: `hold ${this.name}`,
        kind: 'consumer',
        parent,
        carriers: [headers ?? {}],
        attributes: messagingAttributes({ operation: 'receive', destination: this.name }),
      },
      work,
    );
  }

  /**
   * The headers an event is stored with: with a recording hold span, its context (so the release
   * links to it) and the time it was taken.
   */
  static stored(span: TraceSpan, headers: HeaderMap, key: string, seq: number): HeaderMap {
    if (!span.recording) return headers;
    span.set({
      'nest_sequence.resequencer.key': key,
      'nest_sequence.resequencer.seq': seq,
      'messaging.message.conversation_id': key,
    });
    return { ...withTraceHeaders(headers), [HELD_AT_HEADER]: Date.now() };
  }

  release<T>(key: string, entry: ResequencedEntry, work: () => Promise<T>): Promise<T> {
    // Tracing off, or no SDK registered: not even the span's attributes are built, once per event.
    if (!spansMatter(this.tracing)) return work();
    const heldAt = entry.headers[HELD_AT_HEADER];
    const heldMs = typeof heldAt === 'number' ? Math.max(0, Date.now() - heldAt) : undefined;
    return inSpan(
      this.tracing,
      {
        name: `release ${this.name}`,
        kind: 'producer',
        // The event's own hold span (in its headers), not the span of whichever event released
        // it, which may belong to another request's trace.
        parent: carriedParent(this.tracing),
        carriers: [entry.headers],
        attributes: {
          ...messagingAttributes({
            operation: 'send',
            destination: this.name,
            conversationId: key,
            bodyBytes: entry.body.length,
          }),
          'nest_sequence.resequencer.key': key,
          'nest_sequence.resequencer.seq': entry.seq,
          'nest_sequence.resequencer.held_ms': heldMs,
        },
      },
      () => work(),
    );
  }

  /** An event's headers as the output and the handler get them. */
  static delivered(headers: Readonly<Record<string, HeaderMap[string]>>): HeaderMap {
    if (!(HELD_AT_HEADER in headers)) return headers;
    const { [HELD_AT_HEADER]: _heldAt, ...rest } = headers;
    return rest;
  }
}
