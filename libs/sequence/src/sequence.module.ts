import {
  Inject,
  Module,
  type DynamicModule,
  type OnApplicationShutdown,
  type OnModuleInit,
  type Provider,
} from '@nestjs/common';
import { DiscoveryModule, ModulesContainer } from '@nestjs/core';
import { MemoryResequencerStore } from './adapters/stores/memory/memory.resequencer-store';
import { MemorySequenceStore } from './adapters/stores/memory/memory.sequence-store';
import { InMemoryTransport } from './adapters/transports/in-memory/in-memory.transport';
import { CLAIM_CHECK_OPTIONS, CLAIM_CHECK_STORES } from './claim-check/claim-check.constants';
import {
  resolveClaimCheckOptions,
  type ClaimCheckStores,
  type ResolvedClaimCheckOptions,
} from './claim-check/claim-check.options';
import { ClaimCheckReceiver } from './claim-check/claim-check.receiver';
import { ClaimCheckService } from './claim-check/claim-check.service';
import { OrphanSweeper } from './claim-check/orphan.sweeper';
import { PayloadParking } from './claim-check/payload-parking';
import { ClaimCheckExplorer } from './discovery/claim-check.explorer';
import { ClaimCheckRegistry } from './discovery/claim-check.registry';
import { ResequencedExplorer } from './discovery/resequenced.explorer';
import { ResequencerRegistry } from './discovery/resequencer.registry';
import { SequencedHandlerExplorer } from './discovery/sequenced-handler.explorer';
import { SequencedHandlerRegistry } from './discovery/sequenced-handler.registry';
import { ClaimCheckMetrics } from './observability/claim-check.metrics';
import { InboxHandlerExplorer } from './discovery/inbox-handler.explorer';
import { InboxHandlerRegistry } from './discovery/inbox-handler.registry';
import { OutboxMetrics } from './observability/outbox.metrics';
import { OUTBOX_OPTIONS } from './outbox/outbox.constants';
import { resolveOutboxOptions } from './outbox/outbox.options';
import { OutboxRuntime } from './outbox/outbox.runtime';
import { OutboxService } from './outbox/outbox.service';
import { ResequencerMetrics } from './observability/resequencer.metrics';
import type { ResequencerStore } from './ports/resequencer-store.port';
import { GapReporter } from './resequencer/gap.reporter';
import { GapSweeper } from './resequencer/gap.sweeper';
import { RESEQUENCER_OPTIONS, RESEQUENCER_STORE } from './resequencer/resequencer.constants';
import { resolveResequencerModuleOptions } from './resequencer/resequencer.options';
import { ResequencerService } from './resequencer/resequencer.service';
import { SequenceMetrics } from './observability/sequence.metrics';
import type { SequenceStore } from './ports/sequence-store.port';
import type { Transport } from './ports/transport.port';
import { SequenceOptionsError } from './core/errors/sequence-options.error';
import { BootstrapAbort } from './bootstrap-abort';
import { AggregatorService } from './sequence/aggregator.service';
import { ExpirySweeper } from './sequence/expiry.sweeper';
import { SequenceConsumerHost } from './sequence/sequence-consumer.host';
import { SplitterService } from './sequence/splitter.service';
import { SEQUENCE_OPTIONS, SEQUENCE_STORE, SEQUENCE_TRANSPORT } from './sequence.constants';
import {
  ConfigurableSequenceModule,
  SEQUENCE_ASYNC_OPTIONS_TYPE,
  SEQUENCE_MODULE_OPTIONS,
  SEQUENCE_OPTIONS_TYPE,
} from './sequence.module-definition';
import {
  resolveSequenceOptions,
  type ResolvedSequenceOptions,
  type SequenceModuleOptions,
} from './sequence.options';

/** Adapters the module created itself (the embedded defaults) are closed with the application. */
const OWNED_ADAPTERS = Symbol('nest-sequence:owned-adapters');

interface OwnedAdapters {
  transport?: Transport;
  store?: SequenceStore;
  resequencerStore?: ResequencerStore;
}

const providers: Provider[] = [
  {
    provide: OWNED_ADAPTERS,
    inject: [SEQUENCE_MODULE_OPTIONS],
    useFactory: (options: SequenceModuleOptions = {}): OwnedAdapters => ({
      transport: options.transport ? undefined : new InMemoryTransport(),
      store: options.store ? undefined : new MemorySequenceStore(),
      resequencerStore: options.resequencer?.store ? undefined : new MemoryResequencerStore(),
    }),
  },
  {
    provide: SEQUENCE_TRANSPORT,
    inject: [SEQUENCE_MODULE_OPTIONS, OWNED_ADAPTERS],
    useFactory: (options: SequenceModuleOptions = {}, owned: OwnedAdapters) =>
      options.transport ?? owned.transport,
  },
  {
    provide: SEQUENCE_STORE,
    inject: [SEQUENCE_MODULE_OPTIONS, OWNED_ADAPTERS],
    useFactory: (options: SequenceModuleOptions = {}, owned: OwnedAdapters) =>
      options.store ?? owned.store,
  },
  {
    // Validation happens here, while the module builds: bad options fail the bootstrap.
    provide: SEQUENCE_OPTIONS,
    inject: [SEQUENCE_MODULE_OPTIONS, SEQUENCE_TRANSPORT],
    useFactory: (options: SequenceModuleOptions | undefined, transport: Transport) =>
      resolveSequenceOptions(options ?? {}, transport),
  },
  {
    provide: CLAIM_CHECK_OPTIONS,
    inject: [SEQUENCE_MODULE_OPTIONS, SEQUENCE_OPTIONS],
    useFactory: (options: SequenceModuleOptions | undefined, resolved: ResolvedSequenceOptions) =>
      resolveClaimCheckOptions(
        options?.claimCheck,
        resolved.maxFragmentBytes - resolved.headerAllowanceBytes,
        resolved.publish.attempts *
          (resolved.publish.confirmTimeoutMs + resolved.publish.maxDelayMs),
      ),
  },
  {
    provide: CLAIM_CHECK_STORES,
    inject: [CLAIM_CHECK_OPTIONS],
    useFactory: ({ stores, ledger }: ResolvedClaimCheckOptions): ClaimCheckStores => ({
      stores,
      ledger,
    }),
  },
  {
    provide: RESEQUENCER_OPTIONS,
    inject: [SEQUENCE_MODULE_OPTIONS],
    useFactory: (options: SequenceModuleOptions | undefined) =>
      resolveResequencerModuleOptions(options?.resequencer),
  },
  {
    provide: OUTBOX_OPTIONS,
    inject: [SEQUENCE_MODULE_OPTIONS],
    useFactory: (options: SequenceModuleOptions | undefined) =>
      resolveOutboxOptions(options?.outbox),
  },
  {
    provide: RESEQUENCER_STORE,
    inject: [SEQUENCE_MODULE_OPTIONS, OWNED_ADAPTERS],
    useFactory: (options: SequenceModuleOptions = {}, owned: OwnedAdapters) =>
      options.resequencer?.store ?? owned.resequencerStore,
  },
  SequenceMetrics,
  ClaimCheckMetrics,
  ResequencerMetrics,
  SplitterService,
  AggregatorService,
  SequencedHandlerRegistry,
  SequencedHandlerExplorer,
  PayloadParking,
  ClaimCheckService,
  ClaimCheckReceiver,
  ClaimCheckRegistry,
  // After SequencedHandlerExplorer: it refuses channels a sequence handler already took.
  ClaimCheckExplorer,
  OutboxMetrics,
  InboxHandlerRegistry,
  OutboxRuntime,
  OutboxService,
  GapReporter,
  ResequencerRegistry,
  ResequencerService,
  // After the handler explorers above: it refuses channels that they already took.
  ResequencedExplorer,
  // Last: it refuses channels that every other kind of handler already took.
  InboxHandlerExplorer,
  SequenceConsumerHost,
  BootstrapAbort,
  ExpirySweeper,
  OrphanSweeper,
  GapSweeper,
];

/**
 * Message Sequence, Claim Check, Resequencer and Outbox / Inbox for Nest: `SplitterService` /
 * `ClaimCheckService` / `OutboxService` on the producer side, `@SequencedHandler` /
 * `@ClaimCheck` / `@Resequenced` / `@InboxHandler` (or `AggregatorService` /
 * `ResequencerService`) on the consumer side. With no options everything runs in one process
 * (in-memory transport, memory stores, filesystem payload store in the OS temp directory, an
 * in-memory SQLite outbox); pass `transport`, `store`, `claimCheck`, `resequencer` and `outbox`
 * adapters for real servers.
 *
 * @example
 * SequenceModule.forRoot({ fragmentBytes: 8 * 1024 * 1024, timeout: { ms: 120_000 } })
 */
@Module({
  // Not ScheduleModule.forRoot(): a second forRoot in the app would run the app's own
  // @Interval/@Cron jobs twice. The sweeper joins the app's SchedulerRegistry when there is one.
  imports: [DiscoveryModule],
  providers,
  exports: [
    SplitterService,
    AggregatorService,
    ClaimCheckService,
    ResequencerService,
    OutboxService,
    SEQUENCE_TRANSPORT,
    // For nest-sequence/health: what its indicators ping (the symbols are not exported).
    SEQUENCE_STORE,
    RESEQUENCER_STORE,
    CLAIM_CHECK_STORES,
    OutboxRuntime,
  ],
})
export class SequenceModule
  extends ConfigurableSequenceModule
  implements OnModuleInit, OnApplicationShutdown
{
  constructor(
    @Inject(OWNED_ADAPTERS) private readonly owned: OwnedAdapters,
    @Inject(CLAIM_CHECK_OPTIONS) private readonly claimCheck: ResolvedClaimCheckOptions,
    private readonly modules: ModulesContainer,
  ) {
    super();
  }

  /**
   * Refuses a second instance in one application (a second forRoot/forRootAsync import): each
   * instance's explorers find every decorated method of the application, so each channel would
   * have two consumers, with stores of their own, and neither would see whole sequences.
   */
  onModuleInit(): void {
    const instances = [...this.modules.values()].filter(
      (module) => module.metatype === SequenceModule,
    );
    if (instances.length < 2) return;
    throw new SequenceOptionsError('SequenceModule', [
      `SequenceModule is imported ${instances.length} times (each forRoot or forRootAsync call ` +
        `is an instance of its own); import it once, in the root module, with isGlobal: true if ` +
        `other modules inject its services`,
    ]);
  }

  static forRoot(options: typeof SEQUENCE_OPTIONS_TYPE = {}): DynamicModule {
    return super.forRoot(options);
  }

  static forRootAsync(options: typeof SEQUENCE_ASYNC_OPTIONS_TYPE): DynamicModule {
    return super.forRootAsync(options);
  }

  async onApplicationShutdown(): Promise<void> {
    await this.owned.transport?.close();
    await this.owned.store?.close();
    await this.owned.resequencerStore?.close();
    for (const adapter of this.claimCheck.owned) await adapter.close();
  }
}
