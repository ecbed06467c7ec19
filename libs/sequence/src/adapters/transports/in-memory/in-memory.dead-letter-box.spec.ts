import { describeDeadLetterBoxConformance } from '../../../testing/conformance/dead-letter-box.conformance';
import { InMemoryTransport } from './in-memory.transport';

describeDeadLetterBoxConformance('in-memory', {
  create: async () => new InMemoryTransport({ maxMessageBytes: 64 * 1024 }),
});
