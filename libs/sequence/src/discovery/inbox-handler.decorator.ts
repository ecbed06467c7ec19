import { handlerDecorator } from './handler-decorator';

export const INBOX_HANDLER_METADATA = 'nest-sequence:inbox-handler';

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
  /**
   * Longest one call of this handler may run before it is abandoned: `context.signal` is
   * aborted, what it wrote through `context.transaction` is rolled back (the transaction refuses
   * its later statements, as does a `transaction()` it starts), and the call counts as a failed
   * attempt under the inbox's `retry`; in an ordered box, its aggregate waits until it returns.
   * `false`: no limit, whatever the module's. @default the module's handlerTimeoutMs (none)
   */
  handlerTimeoutMs?: number | false;
}

/** What `@InboxHandler` takes: the type of event, or of command, the method handles. */
export type InboxHandlerOptions =
  | (InboxHandlerCommon & { event: string; command?: never })
  | (InboxHandlerCommon & { command: string; event?: never });

/**
 * Marks a provider method as the handler of one event type or command type. Each message is
 * recorded in the inbox by its id before the handler runs: a duplicate (a relay's retry, a
 * broker's redelivery) is acknowledged and skipped, so the handler completes once per id. A
 * handler that throws is called again later (backoff), up to the inbox's `retry.attempts`.
 *
 * @example
 * @InboxHandler({ event: 'OrderPlaced', processInTransaction: true })
 * async reserve(event: OutboxEvent<OrderPlaced>, { transaction }: InboxContext) {
 *   await transaction!.query('UPDATE stock SET reserved = reserved + $1 WHERE sku = $2', [...]);
 * }
 */
export const InboxHandler = (options: InboxHandlerOptions): MethodDecorator =>
  handlerDecorator('@InboxHandler', INBOX_HANDLER_METADATA, options);
