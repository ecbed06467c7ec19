import type { HandlerContext } from '../kernel/handler-call';
import type { ResolvedClaimCheckConsumer } from '../options/resolved-options';
import type { ClaimedPayload } from './claimed-payload';

/** A function that receives claimed payloads. */
export type ClaimCheckHandlerFn = (payload: ClaimedPayload, context: HandlerContext) => unknown;

/** A handler bound to a channel with its resolved options. */
export interface ClaimCheckConsumer extends ResolvedClaimCheckConsumer {
  readonly channel: string;
  readonly handler: ClaimCheckHandlerFn;
}
