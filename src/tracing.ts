import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';

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
