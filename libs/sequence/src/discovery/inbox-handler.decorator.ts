import { SetMetadata } from '@nestjs/common';
import type { InboxHandlerOptions } from '../outbox/inbox-handler.options';

export const INBOX_HANDLER_METADATA = 'nest-sequence:inbox-handler';

/**
 * Marks a provider method as the handler of one event type or command type. Each message is
 * recorded in the inbox by its id before the handler runs: a duplicate (a relay's retry, a
 * broker's redelivery) is acknowledged and skipped, so the handler completes once per id. A
 * handler that throws is called again later (backoff), up to the inbox's `maxAttempts`.
 *
 * @example
 * @InboxHandler({ event: 'OrderPlaced', processInTransaction: true })
 * async reserve(event: OutboxEvent<OrderPlaced>, { transaction }: InboxContext) {
 *   await transaction!.query('UPDATE stock SET reserved = reserved + $1 WHERE sku = $2', [...]);
 * }
 */
export const InboxHandler = (options: InboxHandlerOptions): MethodDecorator =>
  SetMetadata(INBOX_HANDLER_METADATA, options);
