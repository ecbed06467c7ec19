import {
  Inject,
  Injectable,
  Logger,
  type BeforeApplicationShutdown,
  type OnApplicationBootstrap,
} from '@nestjs/common';
import { SequencedHandlerRegistry } from '../discovery/sequenced-handler.registry';
import type { Subscription, Transport } from '../ports/transport.port';
import { SEQUENCE_TRANSPORT } from '../sequence.constants';
import { AggregatorService } from './aggregator.service';

/** Owns the subscriptions of the discovered sequence handlers: opens them at bootstrap, closes them at shutdown. */
@Injectable()
export class SequenceConsumerHost implements OnApplicationBootstrap, BeforeApplicationShutdown {
  private readonly logger = new Logger('SequenceModule');
  private readonly subscriptions: Subscription[] = [];

  constructor(
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    private readonly registry: SequencedHandlerRegistry,
    private readonly aggregator: AggregatorService,
  ) {}

  async onApplicationBootstrap(): Promise<void> {
    for (const { name, consumer } of this.registry.all()) {
      const subscription = await this.transport.subscribe(
        consumer.channel,
        (message) => this.aggregator.receive(message, consumer),
        {
          prefetch: consumer.options.prefetch,
          deadLetterChannel: consumer.options.deadLetterChannel,
        },
      );
      this.subscriptions.push(subscription);
      this.logger.log(
        `${name} consumes sequences from ${consumer.channel} (${this.transport.name})`,
      );
    }
  }

  async beforeApplicationShutdown(): Promise<void> {
    const subscriptions = this.subscriptions.splice(0);
    await Promise.all(subscriptions.map((subscription) => subscription.close()));
  }
}
