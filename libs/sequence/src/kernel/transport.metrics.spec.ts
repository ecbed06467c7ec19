import { Test } from '@nestjs/testing';
import { Registry } from 'prom-client';
import { InMemoryTransport } from '../adapters/transports/in-memory/in-memory.transport';
import { SequenceModule } from '../sequence.module';

describe('TransportMetrics', () => {
  it('reports the dead letters the in-memory transport dropped', async () => {
    const transport = new InMemoryTransport({ maxDeadLetters: 1 });
    const registry = new Registry();
    const app = await Test.createTestingModule({
      imports: [SequenceModule.forRoot({ transport, metrics: { registry } })],
    })
      .compile()
      .then((moduleRef) => moduleRef.init());
    try {
      app.useLogger(false);
      for (let n = 0; n < 4; n++) await transport.publish('a.dlq', Buffer.from([n]), {});
      const metric = await registry
        .getSingleMetric('nest_sequence_transport_dead_letters_dropped')
        ?.get();
      expect(metric?.values).toEqual([{ labels: { transport: 'in-memory' }, value: 3 }]);
    } finally {
      await app.close();
      await transport.close();
    }
  });
});
