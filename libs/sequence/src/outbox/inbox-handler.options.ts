import type { MessageKind } from '../ports/outbox-store.port';
import type { OutboxCommand, OutboxEvent } from '../core/outbox-message';
import type { MessageHeaders, OutboxTransaction } from './outbox-transaction';

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
  /**
   * Aborted when this call runs past `handlerTimeoutMs`, with a `HandlerTimeoutError` as its
   * `reason`, or when it is still running `shutdownTimeoutMs` after its processor began to stop
   * at shutdown, with a `ShutdownTimeoutError` (the message is then handled again later, without
   * counting an attempt): stop. `transaction` then refuses every further statement, and what the
   * call wrote through it is rolled back.
   */
  readonly signal: AbortSignal;
}

/** An inbox handler method. */
export type InboxHandlerFunction = (
  message: OutboxEvent | OutboxCommand,
  context: InboxContext,
) => unknown;
