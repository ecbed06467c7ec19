import { carriedTraceContext, formatTraceparent, parseTraceparent } from './trace-headers';

const TRACE = '4bf92f3577b34da6a3ce929d0e0e4736';
const SPAN = '00f067aa0ba902b7';

describe('trace headers', () => {
  it('formats and parses a W3C traceparent', () => {
    const header = formatTraceparent({ traceId: TRACE, spanId: SPAN, traceFlags: 1 });
    expect(header).toBe(`00-${TRACE}-${SPAN}-01`);
    expect(parseTraceparent(header)).toEqual({ traceId: TRACE, spanId: SPAN, traceFlags: 1 });
  });

  it.each([
    ['all-zero trace id', `00-${'0'.repeat(32)}-${SPAN}-01`],
    ['all-zero span id', `00-${TRACE}-${'0'.repeat(16)}-01`],
    ['version ff', `ff-${TRACE}-${SPAN}-01`],
    ['extra fields on version 00', `00-${TRACE}-${SPAN}-01-extra`],
    ['uppercase hex', `00-${TRACE.toUpperCase()}-${SPAN}-01`],
    ['not a string', 42],
  ])('refuses a traceparent with %s', (_, value) => {
    expect(parseTraceparent(value)).toBeUndefined();
  });

  it('reads a later version as version 00, ignoring what follows', () => {
    expect(parseTraceparent(`01-${TRACE}-${SPAN}-00-more`)).toEqual({
      traceId: TRACE,
      spanId: SPAN,
      traceFlags: 0,
    });
  });

  it("prefers the module's own header over traceparent, which auto-instrumentation rewrites", () => {
    expect(
      carriedTraceContext({
        traceparent: 'instrumentation',
        tracestate: 'a=1',
        'x-message-traceparent': 'module',
        'x-message-tracestate': 'b=2',
      }),
    ).toEqual({ traceparent: 'module', tracestate: 'b=2' });
    expect(carriedTraceContext({ traceparent: 'w3c' })).toEqual({ traceparent: 'w3c' });
    expect(carriedTraceContext({})).toBeUndefined();
  });
});
