import { InMemoryTransport } from 'nest-sequence';
import { setOtelApiForTesting } from '../../src/kernel/tracing/otel-api';
import { bytes, createSequenceTestApp, eventually } from '../support/sequence-test-app';

const TRACE_HEADERS = [
  'traceparent',
  'tracestate',
  'x-message-traceparent',
  'x-message-tracestate',
];

/**
 * Tracing costs nothing and changes nothing when no SDK is registered, and when
 * `@opentelemetry/api` is not installed at all: sequences go through, and no trace header is sent.
 */
describe.each([
  ['@opentelemetry/api installed, no tracer provider registered', undefined],
  ['@opentelemetry/api not installed', null],
] as const)('tracing: %s', (_, api) => {
  beforeAll(() => setOtelApiForTesting(api));
  afterAll(() => setOtelApiForTesting(undefined));

  it('delivers a sequence, and sends no trace header', async () => {
    const transport = new InMemoryTransport();
    const t = await createSequenceTestApp('untraced.in', { transport });
    try {
      const payload = bytes(300_000, 5);
      await t.splitter.send('untraced.in', payload, { fragmentBytes: 64 * 1024 });
      await eventually(() => t.handler.deliveries.length === 1, 'the handler to run');
      expect(t.handler.deliveries[0].bytes.equals(payload)).toBe(true);

      // Unconsumed, so their headers can be read as sent.
      await t.splitter.send('untraced.out', payload, { fragmentBytes: 64 * 1024 });
      const sent = transport.peek('untraced.out');
      expect(sent).toHaveLength(5);
      for (const message of sent) {
        for (const name of TRACE_HEADERS) expect(message.headers).not.toHaveProperty(name);
      }
    } finally {
      await t.close();
      await transport.close();
    }
  });
});
