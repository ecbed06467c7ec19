/**
 * The part of `@opentelemetry/api` the module uses, loaded on first use. The API is an optional
 * peer: an application that does not install it gets no spans and pays nothing. The types are
 * declared here, structurally, rather than imported, so that the library's declarations compile
 * without the package.
 */

/** Attribute values the module sets. */
export type OtelAttributes = Record<string, string | number | boolean | undefined>;

/** The API's SpanContext, as far as the module reads and writes it. */
export interface OtelSpanContext {
  readonly traceId: string;
  readonly spanId: string;
  readonly traceFlags: number;
  readonly isRemote?: boolean;
  readonly traceState?: { serialize(): string };
}

/** The API's Span, as far as the module uses it. */
export interface OtelSpan {
  spanContext(): OtelSpanContext;
  isRecording(): boolean;
  setAttribute(key: string, value: string | number | boolean): unknown;
  setAttributes(attributes: OtelAttributes): unknown;
  addEvent(name: string, attributes?: OtelAttributes): unknown;
  setStatus(status: { code: number; message?: string }): unknown;
  recordException(exception: Error | string): unknown;
  end(): void;
}

/** The API's Context: opaque here but for its values. */
export interface OtelContext {
  getValue(key: symbol): unknown;
  setValue(key: symbol, value: unknown): OtelContext;
}

export interface OtelLink {
  readonly context: OtelSpanContext;
  readonly attributes?: OtelAttributes;
}

export interface OtelSpanOptions {
  kind?: number;
  attributes?: OtelAttributes;
  links?: OtelLink[];
  startTime?: number;
}

export interface OtelTracer {
  startSpan(name: string, options?: OtelSpanOptions, context?: OtelContext): OtelSpan;
}

/** The `@opentelemetry/api` module, as far as the module uses it. */
export interface OtelApi {
  readonly trace: {
    getTracer(name: string, version?: string): OtelTracer;
    getSpan(context: OtelContext): OtelSpan | undefined;
    setSpan(context: OtelContext, span: OtelSpan): OtelContext;
    setSpanContext(context: OtelContext, spanContext: OtelSpanContext): OtelContext;
    isSpanContextValid(spanContext: OtelSpanContext): boolean;
    /** The global provider: a ProxyTracerProvider, whose delegate is a no-op until one is set. */
    getTracerProvider?(): OtelProxyTracerProvider | object;
  };
  readonly context: {
    active(): OtelContext;
    with<T>(context: OtelContext, fn: () => T): T;
  };
  readonly ROOT_CONTEXT: OtelContext;
  createTraceState(raw?: string): { serialize(): string };
}

/** The API's ProxyTracerProvider, as far as the module asks it whether an SDK is registered. */
export interface OtelProxyTracerProvider {
  /** The registered provider, or the API's no-op provider when none is. */
  getDelegate(): object;
  /** The registered provider's tracer; undefined when no provider is registered. */
  getDelegateTracer(name: string): unknown;
}

/** SpanKind values of the API. */
export const OtelSpanKind = {
  internal: 0,
  server: 1,
  client: 2,
  producer: 3,
  consumer: 4,
} as const;
/** SpanStatusCode.ERROR of the API. */
export const OTEL_STATUS_ERROR = 2;

let loaded: OtelApi | null | undefined;

/**
 * `@opentelemetry/api`, or `null` when it is not installed (or cannot be loaded). Looked up
 * once per process.
 */
export function otelApi(): OtelApi | null {
  if (loaded === undefined) {
    try {
      // eslint-disable-next-line @typescript-eslint/no-require-imports
      loaded = require('@opentelemetry/api') as OtelApi;
    } catch {
      loaded = null;
    }
  }
  return loaded;
}

/** For tests: pretend the API is (`api`) or is not (`null`) installed; `undefined` looks again. */
export function setOtelApiForTesting(api: OtelApi | null | undefined): void {
  loaded = api;
}
