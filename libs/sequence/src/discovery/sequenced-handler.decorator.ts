import { handlerDecorator } from './handler-decorator';
import type { SequenceConsumerOptions } from '../options/sequence.options';

export const SEQUENCED_HANDLER_METADATA = 'nest-sequence:sequenced-handler';

export interface SequencedHandlerOptions extends SequenceConsumerOptions {
  /** The channel (queue) whose fragments this method reassembles. */
  channel: string;
  /**
   * `'reassemble'`: the method is called once per complete, verified sequence with a
   * {@link ReassembledPayload}. `'stream'`: it is called once per fragment with a
   * {@link StreamedFragment}, in position order, as soon as each is contiguous (built on the
   * Resequencer: see docs/message-sequence.md#stream-mode).
   * @default 'reassemble'
   */
  mode?: 'reassemble' | 'stream';
}

/**
 * Marks a provider method as the handler of a channel's sequences. It is called once per
 * complete, verified sequence with a {@link ReassembledPayload}; if it throws it is retried
 * (`handlerRetry`), then the sequence is dead-lettered. With `mode: 'stream'` it is called once
 * per fragment instead, in order, with a {@link StreamedFragment}. Its second argument is a
 * `HandlerContext`, whose `signal` is aborted when a call runs past `handlerTimeoutMs`.
 *
 * @example
 * @SequencedHandler({ channel: 'imaging.ai.intake', timeoutMs: 60_000, handlerTimeoutMs: 120_000 })
 * async analyse(study: ReassembledPayload, { signal }: HandlerContext) { ... }
 */
export const SequencedHandler = (options: SequencedHandlerOptions): MethodDecorator =>
  handlerDecorator('@SequencedHandler', SEQUENCED_HANDLER_METADATA, options);
