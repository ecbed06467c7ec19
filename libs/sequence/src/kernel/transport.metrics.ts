import { Inject, Injectable } from '@nestjs/common';
import type { Transport } from '../ports/transport.port';
import { ModuleMetrics } from './module-metrics';
import { SEQUENCE_TRANSPORT } from './tokens';

/**
 * What the transport itself counts: `nest_sequence_transport_dead_letters_dropped`, the dead
 * letters a transport that bounds them (the in-memory one) dropped so far, read at every scrape.
 */
@Injectable()
export class TransportMetrics {
  constructor(metrics: ModuleMetrics, @Inject(SEQUENCE_TRANSPORT) transport: Transport) {
    const dropped = transport.droppedDeadLetters?.bind(transport);
    if (!dropped) return;
    metrics.gauge(
      'transport_dead_letters_dropped',
      'Dead letters the transport dropped, oldest first, to stay within its bounds (so far)',
      ['transport'],
      (gauge) => {
        gauge.set({ transport: transport.name }, dropped());
        return Promise.resolve();
      },
    );
  }
}
