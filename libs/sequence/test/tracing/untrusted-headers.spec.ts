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
      // Positions the contract refuses, though Number() reads each as one.
      const positions = [`1${long}`, ' 2', '03', '1e3', '0x10'];
      for (const [index, position] of positions.entries()) {
        await test.transport.publish(channel, Buffer.from('a'), {
          'x-sequence-id': `${index}${long}`,
          'x-sequence-position': position,
        });
      }
      await eventually(
        () => deadLetters(test.transport, channel).length === positions.length,
        'the dead letters',
      );

      const receives = named(tracing.moduleSpans(), `receive ${channel}`);
      expect(receives).toHaveLength(positions.length);
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
