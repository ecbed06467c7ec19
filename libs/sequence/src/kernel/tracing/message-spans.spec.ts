import { trace } from '@opentelemetry/api';
import { BasicTracerProvider } from '@opentelemetry/sdk-trace-base';
import type { ResolvedTracing } from '../../options/resolved-options';
import { spansMatter } from './message-spans';

const ON: ResolvedTracing = { enabled: true, parent: 'link', maxLinks: 32 };

describe('spansMatter', () => {
  afterEach(() => trace.disable());

  it('is false while no tracer provider is registered, but for spans parented on a carrier', () => {
    expect(spansMatter(ON, 'active')).toBe(false);
    expect(spansMatter(ON)).toBe(false);
    expect(spansMatter(ON, 'child')).toBe(true);
  });

  it('is true once a tracer provider is registered, and false again after it is removed', () => {
    expect(spansMatter(ON, 'active')).toBe(false);
    trace.setGlobalTracerProvider(new BasicTracerProvider());
    expect(spansMatter(ON, 'active')).toBe(true);
    trace.disable();
    expect(spansMatter(ON, 'active')).toBe(false);
  });

  it('is false with tracing off, whatever is registered', () => {
    trace.setGlobalTracerProvider(new BasicTracerProvider());
    expect(spansMatter({ ...ON, enabled: false }, 'child')).toBe(false);
  });
});
