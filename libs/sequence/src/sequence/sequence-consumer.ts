import type { HandlerContext } from '../kernel/handler-call';
import type { ResolvedSequenceConsumer } from '../options/resolved-options';
import type { ReassembledPayload } from './reassembled-payload';

/** A function that receives reassembled sequences. */
export type SequenceHandlerFn = (payload: ReassembledPayload, context: HandlerContext) => unknown;

/** A handler bound to a channel with its resolved options; made by `AggregatorService.createConsumer`. */
export interface SequenceConsumer {
  readonly channel: string;
  readonly options: ResolvedSequenceConsumer;
  readonly handler: SequenceHandlerFn;
}
