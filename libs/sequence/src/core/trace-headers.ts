/**
 * Trace context on the wire: W3C `traceparent` / `tracestate`, and the same context again under
 * names that auto-instrumentation leaves alone. `@opentelemetry/instrumentation-amqplib` (and
 * others) write their own publish span's context into `traceparent` on every broker message; the
 * module's logical span (one per sequence, ticket, event or outbox record, not one per fragment)
 * travels in {@link TraceHeader.messageTraceparent}, which a receiver reads first.
 */
export const TraceHeader = {
  traceparent: 'traceparent',
  tracestate: 'tracestate',
  messageTraceparent: 'x-message-traceparent',
  messageTracestate: 'x-message-tracestate',
} as const;

/** The names of {@link TraceHeader}. */
export const TRACE_HEADER_NAMES: readonly string[] = Object.values(TraceHeader);

const TRACE_HEADERS: ReadonlySet<string> = new Set(TRACE_HEADER_NAMES);

/**
 * True for a trace context header (any case): it is not a user header. A receiver reads the
 * context from the message as it arrived; its handler runs in the span instead.
 */
export function isTraceHeader(name: string): boolean {
  return TRACE_HEADERS.has(name.toLowerCase());
}

/** A span context as a traceparent carries it. */
export interface WireSpanContext {
  /** 32 lowercase hexadecimal characters, not all zero. */
  readonly traceId: string;
  /** 16 lowercase hexadecimal characters, not all zero. */
  readonly spanId: string;
  /** The trace flags byte (bit 0: sampled). */
  readonly traceFlags: number;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;
const ZERO_TRACE = '0'.repeat(32);
const ZERO_SPAN = '0'.repeat(16);

/** `00-<trace id>-<span id>-<flags>`, the W3C Trace Context version 00 format. */
export function formatTraceparent(context: WireSpanContext): string {
  const flags = (context.traceFlags & 0xff).toString(16).padStart(2, '0');
  return `00-${context.traceId}-${context.spanId}-${flags}`;
}

/**
 * A traceparent header's span context, or `undefined` for anything that is not a valid one
 * (all-zero ids, version ff, a version 00 header with extra fields, a value of another type).
 * Later versions are read as version 00, as the W3C recommendation asks.
 */
export function parseTraceparent(value: unknown): WireSpanContext | undefined {
  if (typeof value !== 'string') return undefined;
  const match = TRACEPARENT.exec(value.trim());
  if (!match) return undefined;
  const [, version, traceId, spanId, flags, rest] = match;
  if (version === 'ff' || (version === '00' && rest !== undefined)) return undefined;
  if (traceId === ZERO_TRACE || spanId === ZERO_SPAN) return undefined;
  return { traceId, spanId, traceFlags: parseInt(flags, 16) };
}

/**
 * The traceparent (and tracestate, if any) a message carries: the module's own header first, the
 * W3C one when the message has none (sent by a program that does not run the module).
 */
export function carriedTraceContext(
  headers: Readonly<Record<string, unknown>>,
): { readonly traceparent: string; readonly tracestate?: string } | undefined {
  const own = headers[TraceHeader.messageTraceparent];
  const [traceparent, tracestate] =
    typeof own === 'string'
      ? [own, headers[TraceHeader.messageTracestate]]
      : [headers[TraceHeader.traceparent], headers[TraceHeader.tracestate]];
  if (typeof traceparent !== 'string') return undefined;
  return typeof tracestate === 'string' && tracestate.length > 0
    ? { traceparent, tracestate }
    : { traceparent };
}
