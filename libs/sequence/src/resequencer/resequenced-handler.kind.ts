import { Inject, Injectable } from '@nestjs/common';
import { RESEQUENCED_METADATA } from '../discovery/resequenced.decorator';
import type { ChannelBinding, HandlerKind } from '../kernel/channel-binding';
import type { DecoratedMethod } from '../kernel/decorated-methods';
import type { HandlerContext } from '../kernel/handler-call';
import { resequencerStoreState } from '../kernel/in-process-state.warning';
import { RESEQUENCER_STORE } from '../kernel/tokens';
import type { ResequencerDefinition } from '../options/resequencer.options';
import type { ResequencerStore } from '../ports/resequencer-store.port';
import type { ResequencedEvent } from './resequenced-event';
import { ResequencerService } from './resequencer.service';

const DECORATOR = '@Resequenced';

/** `@Resequenced` methods: each consumes one channel, and receives each key's events in order. */
@Injectable()
export class ResequencedHandlerKind implements HandlerKind<ResequencerDefinition> {
  readonly decorator = DECORATOR;
  readonly metadataKey = RESEQUENCED_METADATA;

  constructor(
    private readonly resequencers: ResequencerService,
    @Inject(RESEQUENCER_STORE) private readonly store: ResequencerStore,
  ) {}

  bind({
    className,
    methodName,
    options,
    call,
  }: DecoratedMethod<ResequencerDefinition>): ChannelBinding[] {
    const name = `${className}.${methodName}`;
    const resequencer = this.resequencers.define(
      `${DECORATOR} on ${name}`,
      options,
      (event: ResequencedEvent, context: HandlerContext) => call(event, context),
    );
    const { channel, prefetch, deadLetterChannel } = resequencer.definition;
    return [
      {
        channel,
        kind: DECORATOR,
        definedBy: name,
        prefetch,
        deadLetterChannel,
        receive: (message) => resequencer.receiveFromChannel(message),
        describe: 'resequences',
        inProcessState: [resequencerStoreState(this.store)],
      },
    ];
  }
}
