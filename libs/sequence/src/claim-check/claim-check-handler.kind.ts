import { Inject, Injectable } from '@nestjs/common';
import {
  CLAIM_CHECK_METADATA,
  type ClaimCheckHandlerOptions,
} from '../discovery/claim-check.decorator';
import type { ChannelBinding, HandlerKind } from '../kernel/channel-binding';
import type { DecoratedMethod } from '../kernel/decorated-methods';
import type { HandlerContext } from '../kernel/handler-call';
import { requireChannel } from '../kernel/discovery.messages';
import {
  checkKeys,
  CLAIM_CHECK_HANDLER_KEYS,
  CLAIM_CHECK_HANDLER_RENAMES,
} from '../options/option-keys';
import { reservedAudienceProblem } from '../core/claim-ticket';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { claimLedgerState, sequenceStoreState } from '../kernel/in-process-state.warning';
import {
  CLAIM_CHECK_STORES,
  RESOLVED_OPTIONS,
  SEQUENCE_STORE,
  type ClaimCheckStores,
} from '../kernel/tokens';
import type { ResolvedOptions } from '../options/resolved-options';
import { resolveClaimCheckConsumer } from '../options/resolve-claim-check';
import type { SequenceStore } from '../ports/sequence-store.port';
import type { ClaimCheckConsumer } from './claim-check-consumer';
import { ClaimCheckReceiver } from './claim-check.receiver';
import type { ClaimedPayload } from './claimed-payload';
import { PayloadParking } from './payload-parking';

const DECORATOR = '@ClaimCheck';

/** `@ClaimCheck` methods: each consumes one channel's payloads, inline, ticketed or sequenced. */
@Injectable()
export class ClaimCheckHandlerKind implements HandlerKind<ClaimCheckHandlerOptions> {
  readonly decorator = DECORATOR;
  readonly metadataKey = CLAIM_CHECK_METADATA;

  constructor(
    @Inject(RESOLVED_OPTIONS) private readonly options: ResolvedOptions,
    @Inject(SEQUENCE_STORE) private readonly sequenceStore: SequenceStore,
    @Inject(CLAIM_CHECK_STORES) private readonly stores: ClaimCheckStores,
    private readonly receiver: ClaimCheckReceiver,
    private readonly parking: PayloadParking,
  ) {}

  bind({
    className,
    methodName,
    options,
    call,
  }: DecoratedMethod<ClaimCheckHandlerOptions>): ChannelBinding[] {
    const name = `${className}.${methodName}`;
    const where = `${DECORATOR} on ${name}`;
    const unknown: string[] = [];
    checkKeys(unknown, options, CLAIM_CHECK_HANDLER_KEYS, CLAIM_CHECK_HANDLER_RENAMES);
    if (unknown.length > 0) throw new SequenceOptionsError(where, unknown);
    const { channel: named, ...consumerOptions } = options;
    const channel = requireChannel(DECORATOR, className, methodName, named);
    const reserved = reservedAudienceProblem(channel);
    if (reserved !== undefined) throw new SequenceOptionsError(where, [reserved]);
    const consumer: ClaimCheckConsumer = {
      channel,
      handler: (payload: ClaimedPayload, context: HandlerContext) => call(payload, context),
      ...resolveClaimCheckConsumer(where, consumerOptions, this.options),
    };
    this.receiver.prepare(consumer);
    // Tickets from other processes verify only with keys they share.
    this.parking.warnIfKeysAreLocal();
    return [
      {
        channel,
        kind: DECORATOR,
        definedBy: name,
        prefetch: consumer.prefetch,
        deadLetterChannel: consumer.deadLetterChannel,
        receive: (message) => this.receiver.receive(message, consumer),
        describe: 'consumes claim checks from',
        // A Claim Check channel reassembles what producers send as a Message Sequence, and
        // records the tickets it handled in the claim ledger.
        inProcessState: [
          sequenceStoreState(this.sequenceStore),
          claimLedgerState(this.stores.ledger),
        ],
      },
    ];
  }
}
