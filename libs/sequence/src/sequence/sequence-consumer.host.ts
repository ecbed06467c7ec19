import {
  Inject,
  Injectable,
  Logger,
  type OnApplicationBootstrap,
  type OnModuleDestroy,
} from '@nestjs/common';
import { ClaimCheckReceiver } from '../claim-check/claim-check.receiver';
import { ClaimCheckRegistry } from '../discovery/claim-check.registry';
import { ResequencerRegistry } from '../discovery/resequencer.registry';
import { SequencedHandlerRegistry } from '../discovery/sequenced-handler.registry';
import type { ResequencerStore } from '../ports/resequencer-store.port';
import type { SequenceStore } from '../ports/sequence-store.port';
import type { Disposition, InboundMessage, Subscription, Transport } from '../ports/transport.port';
import { RESEQUENCER_STORE } from '../resequencer/resequencer.constants';
import { SEQUENCE_OPTIONS, SEQUENCE_STORE, SEQUENCE_TRANSPORT } from '../sequence.constants';
import type { ResolvedSequenceOptions } from '../sequence.options';
import { BootstrapAbort } from '../bootstrap-abort';
import { AggregatorService } from './aggregator.service';
import { settlesWithin } from '../core/async';
import { errorMessage } from '../core/errors/caught';

/**
 * Owns the subscriptions of the discovered handlers (`@SequencedHandler`, `@ClaimCheck`,
 * `@Resequenced`): opens them at bootstrap (all or none: a subscription that fails closes the
 * ones opened before it). At shutdown, in the earliest hook of this module (`onModuleDestroy`:
 * before that of the modules Nest destroys after it, those it imports and those deeper in the
 * application's imports; the root module's and, when this module is global, every other module's
 * come first), it stops taking messages, lets deliveries in progress finish (up to
 * `shutdownTimeoutMs`), then closes them, so a graceful stop does not look like a crash.
 */
@Injectable()
export class SequenceConsumerHost implements OnApplicationBootstrap, OnModuleDestroy {
  private readonly logger = new Logger('SequenceModule');
  private readonly subscriptions: Subscription[] = [];
  private readonly inFlight = new Set<Promise<Disposition>>();
  /** Set at shutdown; resolves when deliveries in progress are done (or the wait timed out). */
  private drained: Promise<void> | undefined;

  constructor(
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(SEQUENCE_OPTIONS) private readonly options: ResolvedSequenceOptions,
    private readonly registry: SequencedHandlerRegistry,
    private readonly aggregator: AggregatorService,
    private readonly claimCheckRegistry: ClaimCheckRegistry,
    private readonly claimCheck: ClaimCheckReceiver,
    private readonly resequencers: ResequencerRegistry,
    private readonly bootstrap: BootstrapAbort,
    @Inject(SEQUENCE_STORE) private readonly store: SequenceStore,
    @Inject(RESEQUENCER_STORE) private readonly resequencerStore: ResequencerStore,
  ) {
    bootstrap.onAbort(() => this.closeSubscriptions());
  }

  async onApplicationBootstrap(): Promise<void> {
    try {
      await this.openAll();
    } catch (error) {
      await this.closeSubscriptions();
      await this.bootstrap.abort();
      throw error;
    }
  }

  private async openAll(): Promise<void> {
    this.warnOfProcessMemory();
    for (const { name, consumer, stream } of this.registry.all()) {
      await this.open(
        consumer.channel,
        (message) =>
          stream ? stream.receive(message) : this.aggregator.receive(message, consumer),
        consumer.options,
      );
      this.logger.log(
        `${name} consumes ${stream ? 'streamed ' : ''}sequences from ${consumer.channel} ` +
          `(${this.transport.name}, prefetch ${consumer.options.prefetch})`,
      );
    }
    for (const { name, consumer } of this.claimCheckRegistry.all()) {
      await this.open(
        consumer.channel,
        (message) => this.claimCheck.receive(message, consumer),
        consumer,
      );
      this.logger.log(
        `${name} consumes claim checks from ${consumer.channel} (${this.transport.name})`,
      );
    }
    for (const { definedBy, resequencer, subscribed } of this.resequencers.all()) {
      if (!subscribed) continue;
      const { channel, prefetch, deadLetterChannel } = resequencer.definition;
      await this.open(channel, (message) => resequencer.receive(message), {
        prefetch,
        deadLetterChannel,
      });
      this.logger.log(`${definedBy} resequences ${channel} (${this.transport.name})`);
    }
  }

  /**
   * A broker that keeps messages (anything but the in-memory transport) with a store that keeps
   * state in this process only: what is acked from the broker once stored is lost with the
   * process, and instances do not share it. Fine for a try-out; said once at startup.
   */
  private warnOfProcessMemory(): void {
    if (this.transport.name === 'in-memory') return;
    const sequences = this.registry.all();
    const resequenced = this.resequencers.all().some(({ subscribed }) => subscribed);
    const risks: string[] = [];
    // Claim Check channels reassemble what producers send as a Message Sequence (`mode: 'auto'`).
    const reassembles =
      sequences.some(({ stream }) => !stream) || this.claimCheckRegistry.all().length > 0;
    if (this.store.name === 'memory' && reassembles) {
      risks.push(
        "sequence fragments (the module's store defaults to MemorySequenceStore; set `store`, " +
          'e.g. RedisSequenceStore)',
      );
    }
    const streamed = sequences.some(({ stream }) => stream);
    if (this.resequencerStore.name === 'memory' && (resequenced || streamed)) {
      risks.push(
        'resequenced and streamed events (`resequencer.store` defaults to MemoryResequencerStore; ' +
          'set it, e.g. RedisResequencerStore)',
      );
    }
    if (risks.length === 0) return;
    this.logger.warn(
      `${this.transport.name} acks what this process keeps in memory only: ${risks.join('; ')}. ` +
        'A crash loses what was acked and not yet delivered, and several instances each hold ' +
        'a part: use a shared store in production',
    );
  }

  private async open(
    channel: string,
    receive: (message: InboundMessage) => Promise<Disposition>,
    options: { prefetch: number; deadLetterChannel?: string },
  ): Promise<void> {
    const subscription = await this.transport.subscribe(
      channel,
      (message) => this.track(() => receive(message)),
      { prefetch: options.prefetch, deadLetterChannel: options.deadLetterChannel },
    );
    this.subscriptions.push(subscription);
    // Another consumer of the module failed meanwhile: stop here (the init has failed).
    if (this.bootstrap.isAborted) throw new Error('another consumer of the module failed to start');
  }

  async onModuleDestroy(): Promise<void> {
    this.drained = this.drain();
    await this.drained;
    await this.closeSubscriptions();
  }

  private async closeSubscriptions(): Promise<void> {
    const subscriptions = this.subscriptions.splice(0);
    await Promise.all(
      subscriptions.map((subscription) =>
        subscription.close().catch((error: unknown) => {
          this.logger.warn(`closing a subscription failed: ${errorMessage(error)}`);
        }),
      ),
    );
  }

  private async drain(): Promise<void> {
    if (this.inFlight.size > 0) {
      const { shutdownTimeoutMs } = this.options;
      if (!(await settlesWithin(Promise.allSettled([...this.inFlight]), shutdownTimeoutMs))) {
        this.logger.warn(
          `${this.inFlight.size} delivery(ies) still running after shutdownTimeoutMs ` +
            `(${this.options.shutdownTimeoutMs} ms); their fragments will be redelivered`,
        );
      }
    }
  }

  private track(receive: () => Promise<Disposition>): Promise<Disposition> {
    if (this.drained) {
      // Held, not settled, until the subscriptions close: they hand unsettled messages back to
      // the queue. Settling now would redeliver it at once, in a loop, for the whole drain.
      return this.drained.then(() => ({ action: 'requeue', reason: 'shutting down' }));
    }
    const pending = receive();
    this.inFlight.add(pending);
    void pending.finally(() => this.inFlight.delete(pending));
    return pending;
  }
}
