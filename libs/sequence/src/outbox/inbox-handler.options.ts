import type { MessageKind } from '../ports/outbox-store.port';
import type { OutboxCommand, OutboxEvent } from './outbox-message';
import type { MessageHeaders, OutboxTransaction } from './outbox-transaction';

interface InboxHandlerCommon {
  /**
   * The channel to consume. @default `events.<type>` for an event, `commands.<serviceName>` for a
   * command (the module's `outbox.serviceName`)
   */
  channel?: string;
  /**
   * Run the handler inside the transaction that marks the inbox record completed, and hand it
   * over as `context.transaction`: what the handler writes through it commits with the mark, or
   * not at all (exactly-once effect for writes to the same database). @default false
   */
  processInTransaction?: boolean;
}

/** What `@InboxHandler` takes: the type of event, or of command, the method handles. */
export type InboxHandlerOptions =
  | (InboxHandlerCommon & { event: string; command?: never })
  | (InboxHandlerCommon & { command: string; event?: never });

/** What an inbox handler is told about the message besides the message itself. */
export interface InboxContext {
  readonly id: string;
  readonly kind: MessageKind;
  readonly type: string;
  /** The string headers the message arrived with. */
  readonly headers: MessageHeaders;
  /**
   * 1 on the first call for this message; one more after each call that threw. A call cut short
   * by the process dying is not counted (its claim rolled back): the next call has the same number.
   */
  readonly attempt: number;
  /** When the inbox recorded it. */
  readonly receivedAt: Date;
  /** With `processInTransaction`: the transaction that marks this message done. */
  readonly transaction?: OutboxTransaction;
}

/** An inbox handler method. */
export type InboxHandlerFunction = (
  message: OutboxEvent | OutboxCommand,
  context: InboxContext,
) => unknown;
