import { Inject, Injectable, type OnApplicationShutdown } from '@nestjs/common';
import type { Transport } from '../ports/transport.port';
import { DeadLetterMetrics } from './dead-letter.metrics';
import { ModuleMetrics } from './module-metrics';
import { SEQUENCE_TRANSPORT } from './tokens';

/**
 * What the transport itself counts: `nest_sequence_transport_dead_letters_dropped`, the dead
 * letters a transport that bounds them (the in-memory one) dropped so far, read at every scrape;
 * and the dead letters it stores on its own (NATS's `max-deliver`), counted in
 * `dead_letters_total` as it tells them.
 */
@Injectable()
export class TransportMetrics implements OnApplicationShutdown {
  private readonly unlisten?: () => void;

  constructor(
    metrics: ModuleMetrics,
    deadLetters: DeadLetterMetrics,
    @Inject(SEQUENCE_TRANSPORT) transport: Transport,
  ) {
    this.unlisten = transport.onDeadLetter?.((channel, reason) =>
      deadLetters.deadLettered(channel, reason),
    );
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

  /**
   * Last: consumers close before (onModuleDestroy), and a transport may store dead letters of its
   * own while their subscriptions drain.
   */
  onApplicationShutdown(): void {
    this.unlisten?.();
  }
}
