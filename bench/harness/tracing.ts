/**
 * `BENCH_TRACING=1`: this process (and each child, which inherits the variable) registers an
 * OpenTelemetry SDK before anything else starts, as an application that traces does: the
 * AsyncLocalStorage context manager, every span sampled, batched by a BatchSpanProcessor and
 * handed to an exporter that drops it (the cost measured is the module's and the SDK's, not a
 * collector's). Unset or `0`: no SDK, so the module's tracing calls reach `@opentelemetry/api`'s
 * no-op tracer. Says so on stderr.
 */
import { context, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import {
  BasicTracerProvider,
  BatchSpanProcessor,
  type ReadableSpan,
  type SpanExporter,
} from '@opentelemetry/sdk-trace-base';
import { switchSetting } from './settings';

/** Whether `BENCH_TRACING` asks for an SDK. */
export function benchTracing(): boolean {
  return switchSetting('BENCH_TRACING', false);
}

/** Spans counted, then dropped. */
class DroppingExporter implements SpanExporter {
  exported = 0;

  export(spans: ReadableSpan[], done: (result: { code: number }) => void): void {
    this.exported += spans.length;
    done({ code: 0 });
  }

  shutdown(): Promise<void> {
    return Promise.resolve();
  }
}

let registered: BasicTracerProvider | undefined;

/** Registers the SDK when `BENCH_TRACING` is on; idempotent. */
export function registerBenchTracing(): void {
  if (registered || !benchTracing()) return;
  registered = new BasicTracerProvider({
    spanProcessors: [new BatchSpanProcessor(new DroppingExporter())],
  });
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(registered);
  process.stderr.write(`[${process.pid}] BENCH_TRACING: an OpenTelemetry SDK records every span\n`);
}
