import {
  Inject,
  Injectable,
  Logger,
  type BeforeApplicationShutdown,
  type OnApplicationBootstrap,
  type OnModuleInit,
} from '@nestjs/common';
import {
  ResequencerService,
  SEQUENCE_TRANSPORT,
  type Resequencer,
  type Subscription,
  type Transport,
} from 'nest-sequence';
import { TRANSFERS_SETTINGS } from './transfers.constants';
import type { TransfersSettings } from './transfers.environment';

/**
 * Puts every transfer's statuses back in order: takes them from the shuffled channel, keeps a
 * status that arrives before its predecessor in the resequencer store (memory, or Redis shared by
 * every instance), and publishes each transfer's statuses to the ordered channel in sequence, with
 * confirms. A transfer that waits for a missing status longer than the gap timeout raises an
 * alert and keeps waiting (policy `'alert'`): a payment status is never skipped or invented.
 *
 * Defined with `ResequencerService.create` rather than `@Resequenced`: the channels and the gap
 * timeout come from the settings this module is registered with (the environment, checked at
 * start), while a decorator's argument is fixed when its class is loaded; and with only an output
 * channel there is no handler, so a decorated method would never be called. The price is owning
 * the subscription, below.
 */
@Injectable()
export class TransferStatusResequencer
  implements OnModuleInit, OnApplicationBootstrap, BeforeApplicationShutdown
{
  private readonly logger = new Logger(TransferStatusResequencer.name);
  private resequencer: Resequencer | undefined;
  private subscription: Subscription | undefined;

  constructor(
    private readonly resequencers: ResequencerService,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(TRANSFERS_SETTINGS) private readonly settings: TransfersSettings,
  ) {}

  /** The resequencer's name, which `ResequencerService.onGap` events and `inspect` use. */
  get name(): string {
    return this.settings.channels.shuffled;
  }

  /** Defined at init, so that the module's gap sweeper covers it from bootstrap on. */
  onModuleInit(): void {
    const { channels, gapTimeoutMs } = this.settings;
    this.resequencer = this.resequencers.create({
      channel: channels.shuffled,
      output: channels.ordered,
      gap: { timeoutMs: gapTimeoutMs, policy: 'alert' },
    });
  }

  async onApplicationBootstrap(): Promise<void> {
    const resequencer = this.resequencer!;
    const { channel, prefetch, deadLetterChannel } = resequencer.definition;
    // The disposition receive() returns settles the message: acked once the store holds the
    // status (or it was delivered), requeued when the store or the broker is unreachable.
    this.subscription = await this.transport.subscribe(
      channel,
      (message) => resequencer.receive(message),
      { prefetch, deadLetterChannel },
    );
    this.logger.log(`resequencing ${channel} into ${resequencer.definition.output}`);
  }

  /**
   * Closing hands unsettled messages back to the channel. That is safe mid-delivery: the store
   * holds what it accepted, and does not accept a redelivered status twice.
   */
  async beforeApplicationShutdown(): Promise<void> {
    await this.subscription?.close();
    this.subscription = undefined;
  }
}
