import type { BasicTracerProvider } from '@opentelemetry/sdk-trace-base';

/**
 * The demos' optional trace export: with `OTEL_EXPORTER_OTLP_ENDPOINT` set (an OTLP/HTTP
 * receiver such as Jaeger's or a collector's, e.g. http://localhost:4318), an OpenTelemetry SDK
 * records the module's spans and exports them there (to `<endpoint>/v1/traces`, or to
 * `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` when that is set) as service `OTEL_SERVICE_NAME` (default
 * `nest-sequence-demo`). Unset: nothing is started, and the module's tracing costs nothing.
 */
let provider: BasicTracerProvider | undefined;

export function startDemoTracing(env: NodeJS.ProcessEnv = process.env): boolean {
  const endpoint = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT ?? env.OTEL_EXPORTER_OTLP_ENDPOINT;
  if (provider || !endpoint) return provider !== undefined;
  // Loaded only when asked for: the SDK and its exporter add to every demo's start-up otherwise.
  /* eslint-disable @typescript-eslint/no-require-imports */
  const { context, trace } = require('@opentelemetry/api') as typeof import('@opentelemetry/api');
  const { AsyncLocalStorageContextManager } =
    require('@opentelemetry/context-async-hooks') as typeof import('@opentelemetry/context-async-hooks');
  const { OTLPTraceExporter } =
    require('@opentelemetry/exporter-trace-otlp-http') as typeof import('@opentelemetry/exporter-trace-otlp-http');
  const { resourceFromAttributes } =
    require('@opentelemetry/resources') as typeof import('@opentelemetry/resources');
  const { BasicTracerProvider, BatchSpanProcessor } =
    require('@opentelemetry/sdk-trace-base') as typeof import('@opentelemetry/sdk-trace-base');
  /* eslint-enable @typescript-eslint/no-require-imports */
  provider = new BasicTracerProvider({
    resource: resourceFromAttributes({
      'service.name': env.OTEL_SERVICE_NAME ?? 'nest-sequence-demo',
    }),
    spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())],
  });
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(provider);
  console.error(`tracing: exporting spans over OTLP/HTTP to ${endpoint}`);
  return true;
}

/** Sends the spans still buffered; call before the process exits. Never rejects. */
export async function flushDemoTracing(): Promise<void> {
  await provider?.forceFlush().catch((error: unknown) => {
    console.error(`tracing: could not export the last spans: ${String(error)}`);
  });
}
