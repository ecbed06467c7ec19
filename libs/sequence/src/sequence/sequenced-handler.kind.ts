import { Inject, Injectable } from '@nestjs/common';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { deadLetterLoopProblem } from '../core/option-checks';
import {
  SEQUENCED_HANDLER_METADATA,
  type SequencedHandlerOptions,
} from '../discovery/sequenced-handler.decorator';
import type { ChannelBinding, HandlerKind } from '../kernel/channel-binding';
import type { DecoratedMethod } from '../kernel/decorated-methods';
import type { HandlerContext } from '../kernel/handler-call';
import { requireChannel } from '../kernel/discovery.messages';
import { checkKeys, CONSUMER_RENAMES, SEQUENCED_HANDLER_KEYS } from '../options/option-keys';
import { resequencerStoreState, sequenceStoreState } from '../kernel/in-process-state.warning';
import { ORDERED_INTAKE, type OrderedIntake } from '../kernel/pattern-contracts';
import {
  RESEQUENCER_STORE,
  RESOLVED_OPTIONS,
  SEQUENCE_STORE,
  SEQUENCE_TRANSPORT,
} from '../kernel/tokens';
import type { InboundMessage, Transport } from '../ports/transport.port';
import { BrokerHeldReassembler } from './broker-held/broker-held.reassembler';
import type { ResolvedOptions } from '../options/resolved-options';
import type { ResequencerStore } from '../ports/resequencer-store.port';
import type { SequenceStore } from '../ports/sequence-store.port';
import { AggregatorService } from './aggregator.service';
import { FragmentStream } from './fragment-stream';
import type { ReassembledPayload } from './reassembled-payload';
import { SequenceMetrics } from './sequence.metrics';
import type { StreamedFragment } from './streamed-fragment';
import { SequenceEvents } from '../kernel/lifecycle-events';
import { SequenceLifecycle } from './sequence.events';

const DECORATOR = '@SequencedHandler';

/** `@SequencedHandler` methods: each consumes one channel's sequences, reassembled or streamed. */
@Injectable()
export class SequencedHandlerKind implements HandlerKind<SequencedHandlerOptions> {
  readonly decorator = DECORATOR;
  readonly metadataKey = SEQUENCED_HANDLER_METADATA;

  constructor(
    private readonly aggregator: AggregatorService,
    private readonly metrics: SequenceMetrics,
    @Inject(ORDERED_INTAKE) private readonly ordering: OrderedIntake,
    @Inject(SEQUENCE_STORE) private readonly store: SequenceStore,
    @Inject(RESEQUENCER_STORE) private readonly resequencerStore: ResequencerStore,
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    private readonly events: SequenceEvents,
    private readonly brokerHeld: BrokerHeldReassembler,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
  ) {}

  bind({
    className,
    methodName,
    options,
    call,
  }: DecoratedMethod<SequencedHandlerOptions>): ChannelBinding[] {
    const name = `${className}.${methodName}`;
    const where = `${DECORATOR} on ${name}`;
    const unknown: string[] = [];
    checkKeys(unknown, options, SEQUENCED_HANDLER_KEYS, CONSUMER_RENAMES);
    if (unknown.length > 0) throw new SequenceOptionsError(where, unknown);
    const { channel: named, mode, ...overrides } = options;
    const channel = requireChannel(DECORATOR, className, methodName, named);
    if (mode !== undefined && mode !== 'reassemble' && mode !== 'stream') {
      throw new SequenceOptionsError(where, [
        `mode must be 'reassemble' or 'stream', got ${String(mode)}`,
      ]);
    }
    const consumer = this.aggregator.createConsumer(
      channel,
      (payload: ReassembledPayload, context: HandlerContext) => call(payload, context),
      overrides,
    );
    const { prefetch, deadLetterChannel } = consumer.options;
    // Checked here, not only by the registry: here it is known which option chose the channel.
    const loop = deadLetterLoopProblem(
      overrides.deadLetterChannel === undefined
        ? "the module's sequence.deadLetterChannel"
        : 'deadLetterChannel',
      deadLetterChannel,
      channel,
    );
    if (loop) throw new SequenceOptionsError(where, [loop]);
    if (consumer.options.buffer === 'broker' && mode === 'stream') {
      throw new SequenceOptionsError(where, [
        "buffer: 'broker' reassembles whole sequences; mode 'stream' hands fragments over as " +
          'they come and has nothing to hold: use one or the other',
      ]);
    }
    if (consumer.options.buffer === 'broker' && !this.transport.partitioned) {
      throw new SequenceOptionsError(where, [
        `buffer: 'broker' needs a transport with partitioned channels; the ` +
          `${this.transport.name} transport has none`,
      ]);
    }
    if (consumer.options.buffer === 'broker' && !this.store.status) {
      throw new SequenceOptionsError(where, [
        `buffer: 'broker' keeps completion markers in the sequence store, and the ` +
          `${this.store.name} store cannot tell a sequence's status (SequenceStore.status)`,
      ]);
    }
    if (mode === 'stream') {
      const stream = new FragmentStream(
        channel,
        consumer.options,
        (fragment: StreamedFragment, context: HandlerContext) => call(fragment, context),
        this.metrics,
        this.ordering,
        where,
        this.options.sequence.maxChannelBufferedBytes,
        new SequenceLifecycle(this.events),
        this.options.sequence.retentionMs,
      );
      return [
        {
          channel,
          kind: DECORATOR,
          definedBy: name,
          prefetch,
          deadLetterChannel,
          receive: (message) => stream.receive(message),
          describe: 'consumes streamed sequences from',
          // Stream mode is built on the Resequencer: its store, not the sequence store.
          inProcessState: [resequencerStoreState(this.resequencerStore)],
        },
      ];
    }
    return [
      {
        channel,
        kind: DECORATOR,
        definedBy: name,
        prefetch,
        deadLetterChannel,
        receive: (message) => this.aggregator.receive(message, consumer),
        describe: 'consumes sequences from',
        inProcessState: [sequenceStoreState(this.store)],
        ...(consumer.options.buffer === 'broker' && {
          partitions: {
            count: consumer.options.partitions,
            prefetch: consumer.options.window,
            receive: (message: InboundMessage) => this.brokerHeld.receive(message, consumer),
            release: () => this.brokerHeld.release(),
          },
        }),
      },
    ];
  }
}
