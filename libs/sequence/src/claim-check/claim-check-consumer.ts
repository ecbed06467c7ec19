import type { HandlerRetryOptions, SequenceConsumerOptions } from '../sequence.options';
import type { ClaimRetention } from './claim-check.options';
import type { ClaimedPayload } from './claimed-payload';

/** A function that receives claimed payloads. */
export type ClaimCheckHandlerFn = (payload: ClaimedPayload) => unknown;

/** Options a `@ClaimCheck` handler may set for its own channel. */
export interface ClaimCheckConsumerOptions {
  /** When its payloads are deleted. @default claimCheck.deleteAfter ('ack') */
  deleteAfter?: ClaimRetention;
  /** Retries of a failing handler before the message is dead-lettered. @default the module's handlerRetry */
  handlerRetry?: HandlerRetryOptions;
  /** Unsettled messages in this consumer's hands at once. @default the module's prefetch */
  prefetch?: number;
  /** Where refused messages go. @default `<channel>.dlq` */
  deadLetterChannel?: string;
  /**
   * For payloads that arrive as a Message Sequence (`mode: 'auto'`): expiry and limits of their
   * reassembly, as `@SequencedHandler` takes them. @default the module's
   *
   * Not `prefetchBytes`: a claim-check channel subscribes with `prefetch` as it is, tickets and
   * fragments alike, so it may hold up to `prefetch × maxFragmentBytes` of fragments.
   */
  sequence?: Omit<
    SequenceConsumerOptions,
    'handlerRetry' | 'prefetch' | 'prefetchBytes' | 'deadLetterChannel'
  >;
}

/** A handler bound to a channel with its resolved options. */
export interface ClaimCheckConsumer {
  readonly channel: string;
  readonly handler: ClaimCheckHandlerFn;
  readonly deleteAfter: ClaimRetention;
  readonly handlerRetry: Required<HandlerRetryOptions>;
  readonly prefetch: number;
  readonly deadLetterChannel?: string;
  readonly sequence?: ClaimCheckConsumerOptions['sequence'];
}
