import { Injectable, type Type } from '@nestjs/common';
import { InboxHandler, type InboxContext, type OutboxEvent } from 'nest-sequence';
import { ORDER_PLACED } from './orders.constants';
import { StockReservations } from './stock-reservations.service';

/**
 * The inbox handler of `OrderPlaced`, consuming `channel`: each event is recorded in the inbox by
 * its id, then handed to the stock side once, inside the transaction that marks it done.
 *
 * Declared per module registration rather than once at the top level: the channel comes from the
 * settings the module is registered with (the environment, checked at start, so that runs sharing
 * a broker stay apart), while a decorator's argument is fixed when its class is declared.
 */
export function orderPlacedInbox(channel: string): Type<unknown> {
  @Injectable()
  class OrderPlacedInbox {
    constructor(private readonly reservations: StockReservations) {}

    @InboxHandler({ event: ORDER_PLACED, channel, processInTransaction: true })
    async reserveStock(event: OutboxEvent, context: InboxContext): Promise<void> {
      // processInTransaction: the inbox always hands over its transaction.
      await this.reservations.reserve(event, context.transaction!);
    }
  }
  return OrderPlacedInbox;
}
