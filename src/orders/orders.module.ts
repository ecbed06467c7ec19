import { Module, type DynamicModule } from '@nestjs/common';
import type { SequenceModuleOptions } from 'nest-sequence';
import { orderPlacedInbox } from './order-placed.inbox';
import { eventChannel, ORDER_PLACED, ORDERS_SETTINGS } from './orders.constants';
import { OrdersController } from './orders.controller';
import type { OrdersSettings } from './orders.environment';
import { OrdersSchema } from './orders.schema';
import { OrdersService } from './orders.service';
import { RelayRetrySimulator } from './relay-retry.simulator';
import { StockController } from './stock.controller';
import { StockReservations } from './stock-reservations.service';

/**
 * The module's Outbox / Inbox options: events published to `<channelPrefix>events.<type>`, where
 * the inbox handler consumes them. The store is the `postgres()` set's when `DATABASE_URL` is set,
 * else the embedded SQLite database.
 */
export function ordersOutboxOptions(settings: OrdersSettings): SequenceModuleOptions['outbox'] {
  return {
    routes: { event: (event) => eventChannel(settings.channelPrefix, event.type) },
  };
}

/**
 * The orders demo: `POST /orders` stores an order and its `OrderPlaced` event in one transaction;
 * the relay publishes the event; the inbox hands it once to the stock side, which reserves the
 * stock or rejects the order in the transaction that marks the event handled. Needs
 * `SequenceModule` (global) configured with {@link ordersOutboxOptions}.
 */
@Module({})
export class OrdersModule {
  static register(settings: OrdersSettings): DynamicModule {
    return {
      module: OrdersModule,
      controllers: [OrdersController, StockController],
      providers: [
        { provide: ORDERS_SETTINGS, useValue: settings },
        OrdersSchema,
        OrdersService,
        StockReservations,
        orderPlacedInbox(eventChannel(settings.channelPrefix, ORDER_PLACED)),
        RelayRetrySimulator,
      ],
      exports: [OrdersService, StockReservations, RelayRetrySimulator],
    };
  }
}
