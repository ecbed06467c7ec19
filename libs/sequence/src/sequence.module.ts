import { Module, type DynamicModule, type OnModuleInit, type Provider } from '@nestjs/common';
import { DiscoveryModule, ModulesContainer } from '@nestjs/core';
import { ClaimCheckHandlerKind } from './claim-check/claim-check-handler.kind';
import { ClaimCheckMetrics } from './claim-check/claim-check.metrics';
import { ClaimCheckReceiver } from './claim-check/claim-check.receiver';
import { ClaimCheckService } from './claim-check/claim-check.service';
import { ClaimCheckFragmentParking } from './claim-check/fragment-parking';
import { OrphanSweeper } from './claim-check/orphan.sweeper';
import { PayloadParking } from './claim-check/payload-parking';
import { SequenceOptionsError } from './core/errors/sequence-options.error';
import { HANDLER_KINDS } from './kernel/channel-binding';
import { ChannelRegistry } from './kernel/channel.registry';
import { ConsumerHost } from './kernel/consumer.host';
import { DeadLetterMetrics } from './kernel/dead-letter.metrics';
import { HandlerExplorer } from './kernel/handler.explorer';
import { LazyModulesWatcher } from './kernel/lazy-modules.watcher';
import { ModuleMetrics } from './kernel/module-metrics';
import { TransportMetrics } from './kernel/transport.metrics';
import {
  FRAGMENT_PARKING,
  ORDERED_INTAKE,
  SEQUENCE_REASSEMBLER,
  SEQUENCE_SENDER,
} from './kernel/pattern-contracts';
import {
  initFailedEverywhere,
  LIFECYCLE_PARTS,
  SequenceLifecycle,
} from './kernel/sequence.lifecycle';
import {
  BOUNDED_SEQUENCE_STORE,
  PAYLOAD_READ_TIMEOUT_MS,
  CLAIM_CHECK_STORES,
  OUTBOX_STORE_SOURCE,
  RESEQUENCER_STORE,
  RESOLVED_OPTIONS,
  SEQUENCE_BUDGETS,
  type SequenceBudgets,
  SEQUENCE_STORE,
  SEQUENCE_METRICS_REGISTRY,
  SEQUENCE_TRANSPORT,
  SWEEP_TIMING,
  type SweepTiming,
} from './kernel/tokens';
import type { SequenceModuleOptions } from './options/module-options';
import { resolveModuleOptions } from './options/resolve-options';
import { MODULE_KEYS, optionsObjectProblem, withoutNullOptions } from './options/option-keys';
import { payloadStoreRetentionProblems } from './options/resolve-claim-check';
import type { ResolvedOptions } from './options/resolved-options';
import type { SequenceStore } from './ports/sequence-store.port';
import { InboxHandlerKind } from './outbox/inbox-handler.kind';
import { InboxHandlers } from './outbox/inbox-handlers';
import { SequenceEvents } from './observability/lifecycle-events';
import { OutboxMetrics } from './outbox/outbox.metrics';
import { OutboxRuntime } from './outbox/outbox.runtime';
import { OutboxService } from './outbox/outbox.service';
import { RuntimeBridge } from './microservices/runtime.bridge';
import { GapReporter } from './resequencer/gap.reporter';
import { GapSweeper } from './resequencer/gap.sweeper';
import { GapTimeoutMetrics } from './resequencer/gap-timeout.metrics';
import { ResequencedHandlerKind } from './resequencer/resequenced-handler.kind';
import { ResequencerCatalog } from './resequencer/resequencer.catalog';
import { ResequencerMetrics } from './resequencer/resequencer.metrics';
import { ResequencerService } from './resequencer/resequencer.service';
import { composeAdapters, OwnedAdapters, type ModuleAdapters } from './sequence.adapters';
import {
  ConfigurableSequenceModule,
  SEQUENCE_ASYNC_OPTIONS_TYPE,
  SEQUENCE_MODULE_OPTIONS,
  SEQUENCE_OPTIONS_TYPE,
} from './sequence.module-definition';
import { AggregatorService } from './sequence/aggregator.service';
import { boundedSequenceStore } from './sequence/bounded-store';
import { BrokerHeldReassembler } from './sequence/broker-held/broker-held.reassembler';
import { ExpirySweeper } from './sequence/expiry.sweeper';
import { SequencedHandlerKind } from './sequence/sequenced-handler.kind';
import { SequenceMetrics } from './sequence/sequence.metrics';
import { SplitterService } from './sequence/splitter.service';

/** The options checked and the adapters chosen, once, while the module builds. */
const COMPOSITION = Symbol('nest-sequence:composition');

interface Composition {
  readonly adapters: ModuleAdapters;
  readonly options: ResolvedOptions;
}

/**
 * The composition root: picks the adapters (the options' own, a `stores` set's, or the embedded
 * defaults) and checks every option against them, listing every problem at once. Bad options
 * fail the bootstrap here.
 */
async function compose(raw: SequenceModuleOptions): Promise<Composition> {
  const notAnObject = optionsObjectProblem(raw);
  if (notAnObject) throw new SequenceOptionsError('SequenceModule options', [notAnObject]);
  const problems: string[] = [];
  // An adapter given as null is refused by resolveModuleOptions, by name, once.
  const adapters = composeAdapters(withoutNullOptions(raw, MODULE_KEYS), problems);
  const options = resolveModuleOptions(problems, raw, adapters.transport);
  problems.push(
    ...payloadStoreRetentionProblems(
      adapters.claimCheck.stores.values(),
      options.claimCheck.expiredGraceMs,
    ),
  );
  if (problems.length > 0) {
    // Nest runs no hook for an application that fails to build: what the module owns (a
    // `stores` set's connections, a transport it closes) would keep the process alive.
    await new OwnedAdapters(adapters.owned, OWNED_CLOSE_MS).close();
    throw new SequenceOptionsError('SequenceModule options', problems);
  }
  return { adapters, options };
}

/** How long each owned adapter's close is waited for when the options are refused. */
const OWNED_CLOSE_MS = 1_000;

const providers: Provider[] = [
  { provide: COMPOSITION, inject: [SEQUENCE_MODULE_OPTIONS], useFactory: compose },
  ...(
    [
      [RESOLVED_OPTIONS, (c: Composition) => c.options],
      [
        SEQUENCE_BUDGETS,
        ({ options: { sequence } }: Composition): SequenceBudgets => ({
          maxBufferedBytes: sequence.maxBufferedBytes,
          maxChannelBufferedBytes: sequence.maxChannelBufferedBytes,
        }),
      ],
      [
        SWEEP_TIMING,
        ({ options: { sequence, tuning } }: Composition): SweepTiming => ({
          sequenceTimeout: sequence.consumer.timeout,
          expirySweepMs: tuning.sweepers.expiry.intervalMs,
          gapSweepMs: tuning.sweepers.gaps.intervalMs,
        }),
      ],
      [SEQUENCE_TRANSPORT, (c: Composition) => c.adapters.transport],
      [SEQUENCE_STORE, (c: Composition) => c.adapters.sequenceStore],
      [RESEQUENCER_STORE, (c: Composition) => c.adapters.resequencerStore],
      [CLAIM_CHECK_STORES, (c: Composition) => c.adapters.claimCheck],
      [OUTBOX_STORE_SOURCE, (c: Composition) => c.adapters.outbox],
    ] as const
  ).map(([provide, pick]) => ({ provide, inject: [COMPOSITION], useFactory: pick })),
  {
    // What Message Sequence works on: a store step that never answers fails after storeTimeoutMs.
    provide: BOUNDED_SEQUENCE_STORE,
    inject: [SEQUENCE_STORE, RESOLVED_OPTIONS],
    useFactory: (store: SequenceStore, options: ResolvedOptions) =>
      boundedSequenceStore(store, options.tuning.storeTimeoutMs),
  },
  {
    provide: PAYLOAD_READ_TIMEOUT_MS,
    inject: [RESOLVED_OPTIONS],
    useFactory: (options: ResolvedOptions) => options.claimCheck.readTimeoutMs,
  },
  {
    provide: OwnedAdapters,
    inject: [COMPOSITION],
    useFactory: ({ adapters, options }: Composition) =>
      new OwnedAdapters(adapters.owned, Math.max(options.shutdownTimeoutMs, 1_000)),
  },
  // The kernel: one registry of channels, one explorer (and its watcher of lazily loaded
  // modules), one consumer host, one lifecycle owner.
  ModuleMetrics,
  TransportMetrics,
  DeadLetterMetrics,
  {
    provide: SEQUENCE_METRICS_REGISTRY,
    inject: [ModuleMetrics],
    useFactory: (metrics: ModuleMetrics) => metrics.registry,
  },
  SequenceEvents,
  ChannelRegistry,
  HandlerExplorer,
  ConsumerHost,
  SequenceLifecycle,
  LazyModulesWatcher,
  // Message Sequence
  SequenceMetrics,
  SplitterService,
  AggregatorService,
  BrokerHeldReassembler,
  ExpirySweeper,
  SequencedHandlerKind,
  // Claim Check
  ClaimCheckMetrics,
  PayloadParking,
  ClaimCheckFragmentParking,
  ClaimCheckService,
  ClaimCheckReceiver,
  OrphanSweeper,
  ClaimCheckHandlerKind,
  // Resequencer
  ResequencerMetrics,
  GapTimeoutMetrics,
  ResequencerCatalog,
  GapReporter,
  ResequencerService,
  GapSweeper,
  ResequencedHandlerKind,
  // Outbox / Inbox
  OutboxMetrics,
  InboxHandlers,
  OutboxRuntime,
  OutboxService,
  InboxHandlerKind,
  // @nestjs/microservices: what SequenceServer and SequenceClient use (nest-sequence/microservices)
  RuntimeBridge,
  // What the patterns offer each other, bound here: they never import one another.
  { provide: SEQUENCE_SENDER, useExisting: SplitterService },
  { provide: SEQUENCE_REASSEMBLER, useExisting: AggregatorService },
  { provide: FRAGMENT_PARKING, useExisting: ClaimCheckFragmentParking },
  { provide: ORDERED_INTAKE, useExisting: ResequencerService },
  {
    provide: HANDLER_KINDS,
    inject: [SequencedHandlerKind, ClaimCheckHandlerKind, ResequencedHandlerKind, InboxHandlerKind],
    useFactory: (...kinds: unknown[]) => kinds,
  },
  {
    // Started in this order, stopped in the reverse one.
    provide: LIFECYCLE_PARTS,
    inject: [
      ModuleMetrics,
      OwnedAdapters,
      AggregatorService,
      OutboxRuntime,
      ExpirySweeper,
      OrphanSweeper,
      GapSweeper,
    ],
    useFactory: (...parts: unknown[]) => parts,
  },
];

/**
 * Message Sequence, Claim Check, Resequencer and Outbox / Inbox for Nest: `SplitterService` /
 * `ClaimCheckService` / `OutboxService` on the producer side, `@SequencedHandler` /
 * `@ClaimCheck` / `@Resequenced` / `@InboxHandler` (or `AggregatorService` /
 * `ResequencerService`) on the consumer side. With no options everything runs in one process
 * (in-memory transport, memory stores, filesystem payload store in the OS temp directory, an
 * in-memory SQLite outbox); a `transport` and `stores` (presets of the backend subpaths) put it
 * on real servers.
 *
 * @example
 * SequenceModule.forRoot({ sequence: { fragmentBytes: 8 * 1024 * 1024, timeoutMs: 120_000 } })
 */
@Module({
  // Not ScheduleModule.forRoot(): a second forRoot in the app would run the app's own
  // @Interval/@Cron jobs twice. The sweepers join the app's SchedulerRegistry when there is one.
  imports: [DiscoveryModule],
  providers,
  exports: [
    SplitterService,
    AggregatorService,
    ClaimCheckService,
    ResequencerService,
    OutboxService,
    SequenceEvents,
    SEQUENCE_TRANSPORT,
    SEQUENCE_METRICS_REGISTRY,
    // For nest-sequence/health: what its indicators ping, and the budgets and timeouts they
    // judge against (the symbols are not exported).
    SEQUENCE_BUDGETS,
    SWEEP_TIMING,
    SEQUENCE_STORE,
    RESEQUENCER_STORE,
    CLAIM_CHECK_STORES,
    OutboxRuntime,
    // For nest-sequence/admin: the sequence store, each step bounded by tuning.storeTimeoutMs,
    // and the bound of its payload store reads.
    BOUNDED_SEQUENCE_STORE,
    PAYLOAD_READ_TIMEOUT_MS,
    // For nest-sequence/admin: the channels consumed and the resequencers, to list and act on.
    ChannelRegistry,
    ResequencerCatalog,
  ],
})
export class SequenceModule extends ConfigurableSequenceModule implements OnModuleInit {
  constructor(private readonly modules: ModulesContainer) {
    super();
  }

  /**
   * Refuses a second instance in one application (a second forRoot/forRootAsync import): each
   * instance's explorer finds every decorated method of the application, so each channel would
   * have two consumers, with stores of their own, and neither would see whole sequences.
   */
  async onModuleInit(): Promise<void> {
    const instances = [...this.modules.values()].filter(
      (module) => module.metatype === SequenceModule,
    );
    if (instances.length < 2) return;
    await initFailedEverywhere(instances);
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
}
