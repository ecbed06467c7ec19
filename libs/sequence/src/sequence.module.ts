import {
  Inject,
  Module,
  type DynamicModule,
  type OnApplicationShutdown,
  type Provider,
} from '@nestjs/common';
import { DiscoveryModule } from '@nestjs/core';
import { MemorySequenceStore } from './adapters/stores/memory/memory.sequence-store';
import { InMemoryTransport } from './adapters/transports/in-memory/in-memory.transport';
import { CLAIM_CHECK_OPTIONS } from './claim-check/claim-check.constants';
import {
  resolveClaimCheckOptions,
  type ResolvedClaimCheckOptions,
} from './claim-check/claim-check.options';
import { ClaimCheckReceiver } from './claim-check/claim-check.receiver';
import { ClaimCheckService } from './claim-check/claim-check.service';
import { OrphanSweeper } from './claim-check/orphan.sweeper';
import { PayloadParking } from './claim-check/payload-parking';
import { ClaimCheckExplorer } from './discovery/claim-check.explorer';
import { ClaimCheckRegistry } from './discovery/claim-check.registry';
import { SequencedHandlerExplorer } from './discovery/sequenced-handler.explorer';
import { SequencedHandlerRegistry } from './discovery/sequenced-handler.registry';
import { ClaimCheckMetrics } from './observability/claim-check.metrics';
import { SequenceMetrics } from './observability/sequence.metrics';
import type { SequenceStore } from './ports/sequence-store.port';
import type { Transport } from './ports/transport.port';
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
}

const providers: Provider[] = [
  {
    provide: OWNED_ADAPTERS,
    inject: [SEQUENCE_MODULE_OPTIONS],
    useFactory: (options: SequenceModuleOptions = {}): OwnedAdapters => ({
      transport: options.transport ? undefined : new InMemoryTransport(),
      store: options.store ? undefined : new MemorySequenceStore(),
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
      ),
  },
  SequenceMetrics,
  ClaimCheckMetrics,
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
  SequenceConsumerHost,
  ExpirySweeper,
  OrphanSweeper,
];

/**
 * Message Sequence and Claim Check for Nest: `SplitterService` / `ClaimCheckService` on the
 * producer side, `@SequencedHandler` / `@ClaimCheck` (or `AggregatorService`) on the consumer
 * side. With no options everything runs in one process (in-memory transport, memory store,
 * filesystem payload store in the OS temp directory); pass `transport`, `store` and
 * `claimCheck` adapters for real servers.
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
    SequenceMetrics,
    SequencedHandlerRegistry,
    ExpirySweeper,
    ClaimCheckService,
    ClaimCheckMetrics,
    ClaimCheckRegistry,
    OrphanSweeper,
    CLAIM_CHECK_OPTIONS,
    SEQUENCE_TRANSPORT,
    SEQUENCE_STORE,
    SEQUENCE_OPTIONS,
  ],
})
export class SequenceModule extends ConfigurableSequenceModule implements OnApplicationShutdown {
  constructor(
    @Inject(OWNED_ADAPTERS) private readonly owned: OwnedAdapters,
    @Inject(CLAIM_CHECK_OPTIONS) private readonly claimCheck: ResolvedClaimCheckOptions,
  ) {
    super();
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
    for (const adapter of this.claimCheck.owned) await adapter.close();
  }
}
