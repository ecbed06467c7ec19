import { randomUUID } from 'node:crypto';
import { createSequenceTestApp, deadLetters, eventually } from '../support/sequence-test-app';
import { named, useInMemoryTracing } from './in-memory-tracing';

/**
 * The receive span of a fragment is opened before its headers are checked: what it records and
 * remembers of them must be what the wire contract allows, not whatever another program sent.
 */
describe('tracing: fragments with headers outside the wire contract', () => {
  const tracing = useInMemoryTracing();

  it('records no id from a sequence id outside the contract, however long, and remembers none', async () => {
    const channel = `tracing.untrusted.${randomUUID()}`;
    const test = await createSequenceTestApp(channel, { metrics: false });
    try {
      const long = 'x'.repeat(25 * 1024);
      for (let index = 0; index < 5; index++) {
        await test.transport.publish(channel, Buffer.from('a'), {
          'x-sequence-id': `${index}${long}`,
          'x-sequence-position': `${index}${long}`,
        });
      }
      await eventually(() => deadLetters(test.transport, channel).length === 5, 'the dead letters');

      const receives = named(tracing.moduleSpans(), `receive ${channel}`);
      expect(receives).toHaveLength(5);
      for (const span of receives) {
        expect(span.attributes['messaging.message.id']).toBeUndefined();
        expect(span.attributes['messaging.message.conversation_id']).toBeUndefined();
        expect(span.attributes['nest_sequence.fragment.position']).toBeUndefined();
      }
    } finally {
      await test.close();
    }
  });
});
