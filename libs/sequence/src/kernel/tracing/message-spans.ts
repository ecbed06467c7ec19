import {
  carriedTraceContext,
  formatTraceparent,
  parseTraceparent,
  TraceHeader,
  type WireSpanContext,
} from '../../core/trace-headers';
import type { HeaderMap } from '../../core/headers';
import type { ResolvedTracing } from '../../options/resolved-options';
import {
  OTEL_STATUS_ERROR,
  otelApi,
  OtelSpanKind,
  type OtelApi,
  type OtelAttributes,
  type OtelContext,
  type OtelLink,
  type OtelProxyTracerProvider,
  type OtelSpan,
  type OtelSpanContext,
  type OtelTracer,
} from './otel-api';
import { textOf } from '../../core/errors/caught';

/** The instrumentation scope of every span of the module. */
export const TRACER_NAME = 'nest-sequence';
/** `messaging.system` of the module's spans: the patterns' own layer over the broker. */
export const MESSAGING_SYSTEM = 'nest-sequence';

/** A span of the module, or a stand-in that records nothing (no API, no SDK). */
export interface TraceSpan {
  /** False when nothing is recorded: skip work done only for the span. */
  readonly recording: boolean;
  set(attributes: OtelAttributes): void;
  event(name: string, attributes?: OtelAttributes): void;
  /** Its span context, as links take it; `undefined` for the stand-in. */
  context(): OtelSpanContext | undefined;
}

/** What a span is about. */
export interface SpanPlan {
  readonly name: string;
  readonly kind: keyof typeof OtelSpanKind;
  readonly attributes?: OtelAttributes;
  /**
   * Headers of the messages it handles: each one's carried context (see `carriedTraceContext`)
   * becomes a link, or, with `parent: 'child'`, the first one the span's parent.
   */
  readonly carriers?: readonly Readonly<Record<string, unknown>>[];
  /** More span contexts to link (a sequence's fragments). */
  readonly links?: readonly OtelSpanContext[];
  /**
   * Where the span hangs: `'active'` (default), the active context; `'outer'`, the context that
   * was active outside the innermost span of the module (a handler's span beside the span of the
   * message that completed its sequence, not under it); `'child'` of the first carrier's context.
   */
  readonly parent?: 'active' | 'outer' | 'child';
  /** Backdated start, ms since the epoch. */
  readonly startTime?: number;
}

/**
 * Where the span of a message (or a record) the module took hangs: on its carried context with
 * `tracing.parent: 'child'`, else on `otherwise` (the active context unless said).
 */
export function carriedParent(
  tracing: ResolvedTracing,
  otherwise: 'active' | 'outer' = 'active',
): NonNullable<SpanPlan['parent']> {
  return tracing.parent === 'child' ? 'child' : otherwise;
}

/** The span that work run with tracing off gets: it records nothing. */
export const NOT_RECORDING: TraceSpan = {
  recording: false,
  set: () => undefined,
  event: () => undefined,
  context: () => undefined,
};

/** The context key under which a span of the module keeps the context outside it. */
const OUTER = Symbol('nest-sequence:outer-context');

let tracer: OtelTracer | undefined;

/** The API's no-op tracer provider, once seen: the delegate while no SDK is registered. */
let noopProvider: object | undefined;
let lookedForNoop = false;

/**
 * Whether no tracer provider is registered with the API now (an SDK may be registered later).
 * Its no-op tracer's spans record nothing and take the active context's span context: work run
 * outside such a span sees the same trace context, and no span is lost. Answers false when it
 * cannot tell (an API without a ProxyTracerProvider).
 */
function noTracerProvider(api: OtelApi): boolean {
  const provider = api.trace.getTracerProvider?.() as Partial<OtelProxyTracerProvider> | undefined;
  if (typeof provider?.getDelegate !== 'function') return false;
  const delegate = provider.getDelegate();
  if (!lookedForNoop && typeof provider.getDelegateTracer === 'function') {
    lookedForNoop = true;
    if (provider.getDelegateTracer(TRACER_NAME) === undefined) noopProvider = delegate;
  }
  return delegate === noopProvider;
}

/**
 * Whether a span of `parent` could record anything or give its work another trace context:
 * false when tracing is off, `@opentelemetry/api` is not installed, or no tracer provider is
 * registered and the span would not be parented on a carried context (`'child'`). Callers skip
 * building a span's attributes when it is false: per message, building them (and a no-op span)
 * is most of what tracing without an SDK would cost.
 */
export function spansMatter(tracing: ResolvedTracing, parent?: SpanPlan['parent']): boolean {
  if (!tracing.enabled) return false;
  const api = otelApi();
  if (!api) return false;
  return parent === 'child' || !noTracerProvider(api);
}

function tracerOf(api: OtelApi): OtelTracer {
  tracer ??= api.trace.getTracer(TRACER_NAME);
  return tracer;
}

/**
 * Runs `work` in a span of the module, active while it runs, and ends the span when it settles.
 * A rejection is recorded on the span (status ERROR) and rethrown; a resolved value that is a
 * disposition sets `nest_sequence.disposition` (and status ERROR for a dead letter). Without
 * `@opentelemetry/api` `work` runs alone.
 */
export async function inSpan<T>(
  tracing: ResolvedTracing,
  plan: SpanPlan,
  work: (span: TraceSpan) => Promise<T>,
): Promise<T> {
  const api = otelApi();
  if (!api || !spansMatter(tracing, plan.parent)) return work(NOT_RECORDING);
  const active = api.context.active();
  const carried = (plan.carriers ?? []).map((headers) => carriedSpanContext(api, headers));
  const links: OtelLink[] = [];
  let parent = active;
  if (plan.parent === 'outer') {
    parent = (active.getValue(OUTER) as OtelContext | undefined) ?? active;
  }
  let parentCarried = plan.parent === 'child' ? carried.find((c) => c !== undefined) : undefined;
  if (parentCarried) parent = api.trace.setSpanContext(active, parentCarried);
  for (const context of carried) {
    if (!context) continue;
    // The parent of a child span is linked no more, but a message the span handles once more is.
    if (context === parentCarried) parentCarried = undefined;
    else links.push({ context });
  }
  for (const context of plan.links ?? []) links.push({ context });
  const span = tracerOf(api).startSpan(
    plan.name,
    {
      kind: OtelSpanKind[plan.kind],
      attributes: plan.attributes,
      links: links.slice(0, tracing.maxLinks),
      startTime: plan.startTime,
    },
    parent,
  );
  const handle = spanHandle(span);
  const inside = api.trace.setSpan(parent, span).setValue(OUTER, parent);
  try {
    const result = await api.context.with(inside, () => work(handle));
    settled(span, result);
    return result;
  } catch (error) {
    span.recordException(error instanceof Error ? error : textOf(error));
    span.setStatus({ code: OTEL_STATUS_ERROR, message: (error as Error | undefined)?.message });
    throw error;
  } finally {
    span.end();
  }
}

/**
 * `headers` plus the active span's context (W3C `traceparent` and `tracestate`, and the same under
 * the module's own names), or `headers` as they are when no valid span is active. Every message
 * the module publishes goes through here.
 */
export function withTraceHeaders(headers: HeaderMap): HeaderMap {
  const api = otelApi();
  if (!api) return headers;
  const span = api.trace.getSpan(api.context.active());
  if (!span) return headers;
  const context = span.spanContext();
  if (!api.trace.isSpanContextValid(context)) return headers;
  const traceparent = formatTraceparent(context);
  const tracestate = context.traceState?.serialize() ?? '';
  const traced: HeaderMap = {
    ...headers,
    [TraceHeader.traceparent]: traceparent,
    [TraceHeader.messageTraceparent]: traceparent,
  };
  if (tracestate) {
    traced[TraceHeader.tracestate] = tracestate;
    traced[TraceHeader.messageTracestate] = tracestate;
  } else {
    delete traced[TraceHeader.tracestate];
    delete traced[TraceHeader.messageTracestate];
  }
  return traced;
}

/** The span context a message carries (see `carriedTraceContext`), as the API takes it. */
export function carriedSpanContext(
  api: OtelApi,
  headers: Readonly<Record<string, unknown>>,
): OtelSpanContext | undefined {
  const carried = carriedTraceContext(headers);
  const parsed: WireSpanContext | undefined = parseTraceparent(carried?.traceparent);
  if (!parsed) return undefined;
  let traceState: OtelSpanContext['traceState'];
  if (carried?.tracestate) {
    try {
      traceState = api.createTraceState(carried.tracestate);
    } catch {
      traceState = undefined;
    }
  }
  return { ...parsed, isRemote: true, traceState };
}

/** Messaging attributes per the OpenTelemetry semantic conventions. */
export function messagingAttributes(fields: {
  readonly operation: 'create' | 'send' | 'receive' | 'process' | 'settle';
  readonly destination?: string;
  readonly messageId?: string;
  readonly conversationId?: string;
  readonly bodyBytes?: number;
  readonly batchCount?: number;
}): OtelAttributes {
  return {
    'messaging.system': MESSAGING_SYSTEM,
    'messaging.operation.type': fields.operation,
    'messaging.operation.name': fields.operation,
    'messaging.destination.name': fields.destination,
    'messaging.message.id': fields.messageId,
    'messaging.message.conversation_id': fields.conversationId,
    'messaging.message.body.size': fields.bodyBytes,
    'messaging.batch.message_count': fields.batchCount,
  };
}

function spanHandle(span: OtelSpan): TraceSpan {
  const recording = span.isRecording();
  if (!recording) return { ...NOT_RECORDING, context: () => span.spanContext() };
  return {
    recording,
    set: (attributes) => span.setAttributes(attributes),
    event: (name, attributes) => span.addEvent(name, attributes),
    context: () => span.spanContext(),
  };
}

function settled(span: OtelSpan, result: unknown): void {
  if (!span.isRecording() || typeof result !== 'object' || result === null) return;
  const { action, reason } = result as { action?: unknown; reason?: unknown };
  if (action !== 'ack' && action !== 'requeue' && action !== 'dead-letter') return;
  span.setAttribute('nest_sequence.disposition', action);
  if (action === 'dead-letter') {
    span.setStatus({ code: OTEL_STATUS_ERROR, message: textOf(reason) });
  }
}
