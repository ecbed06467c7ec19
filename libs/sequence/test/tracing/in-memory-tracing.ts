/**
 * An OpenTelemetry SDK for tests: a tracer provider that keeps finished spans in memory, the
 * AsyncLocalStorage context manager and the W3C propagator, registered globally for the test
 * file and removed after it (the API's globals outlive a jest module registry).
 */
import {
  context,
  propagation,
  trace,
  type Context,
  type SpanContext,
  type TextMapGetter,
  type TextMapPropagator,
  type TextMapSetter,
} from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  SimpleSpanProcessor,
  type ReadableSpan,
} from '@opentelemetry/sdk-trace-base';
import { formatTraceparent, parseTraceparent } from '../../src/core/trace-headers';

export interface InMemoryTracing {
  readonly provider: BasicTracerProvider;
  readonly exporter: InMemorySpanExporter;
  /** Finished spans of the module (instrumentation scope `nest-sequence`). */
  moduleSpans(): ReadableSpan[];
  /** Every finished span. */
  spans(): ReadableSpan[];
}

/** Registers the SDK before the file's tests and removes it after them. */
export function useInMemoryTracing(): InMemoryTracing {
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({
    spanProcessors: [new SimpleSpanProcessor(exporter)],
  });
  beforeAll(() => {
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
    propagation.setGlobalPropagator(new TraceparentPropagator());
    trace.setGlobalTracerProvider(provider);
  });
  afterEach(() => exporter.reset());
  afterAll(async () => {
    await provider.shutdown();
    trace.disable();
    context.disable();
    propagation.disable();
  });
  return {
    provider,
    exporter,
    spans: () => exporter.getFinishedSpans(),
    moduleSpans: () =>
      exporter
        .getFinishedSpans()
        .filter((span) => span.instrumentationScope.name === 'nest-sequence'),
  };
}

export function idOf(context: SpanContext): string {
  return `${context.traceId}-${context.spanId}`;
}

/**
 * The spans reachable from `root` through parent-child edges and links, in either direction: a
 * connected trace, as a trace viewer that follows links shows it.
 */
export function connectedTo(root: ReadableSpan, spans: readonly ReadableSpan[]): Set<string> {
  const edges = new Map<string, Set<string>>();
  const edge = (a: string, b: string) => {
    if (!edges.has(a)) edges.set(a, new Set());
    if (!edges.has(b)) edges.set(b, new Set());
    edges.get(a)!.add(b);
    edges.get(b)!.add(a);
  };
  for (const span of spans) {
    const self = idOf(span.spanContext());
    edges.set(self, edges.get(self) ?? new Set());
    const parent = span.parentSpanContext;
    if (parent) edge(self, idOf(parent));
    for (const link of span.links) edge(self, idOf(link.context));
  }
  const seen = new Set<string>();
  const queue = [idOf(root.spanContext())];
  while (queue.length > 0) {
    const next = queue.pop()!;
    if (seen.has(next)) continue;
    seen.add(next);
    for (const neighbour of edges.get(next) ?? []) queue.push(neighbour);
  }
  return seen;
}

/** The spans named `name` (exactly). */
export function named(spans: readonly ReadableSpan[], name: string): ReadableSpan[] {
  return spans.filter((span) => span.name === name);
}

/**
 * The W3C `traceparent` header as a propagator (what an SDK registers by default), for the
 * amqplib instrumentation to write and read.
 */
class TraceparentPropagator implements TextMapPropagator {
  inject(ctx: Context, carrier: unknown, setter: TextMapSetter): void {
    const span = trace.getSpanContext(ctx);
    if (!span || !trace.isSpanContextValid(span)) return;
    setter.set(carrier, 'traceparent', formatTraceparent(span));
  }

  extract(ctx: Context, carrier: unknown, getter: TextMapGetter): Context {
    const raw = getter.get(carrier, 'traceparent');
    const parsed = parseTraceparent(Array.isArray(raw) ? raw[0] : raw);
    return parsed ? trace.setSpanContext(ctx, { ...parsed, isRemote: true }) : ctx;
  }

  fields(): string[] {
    return ['traceparent'];
  }
}
