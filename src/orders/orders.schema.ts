import { Inject, Injectable, type OnApplicationBootstrap } from '@nestjs/common';
import { OutboxService } from 'nest-sequence';
import { ORDERS_SETTINGS } from './orders.constants';
import type { OrdersSettings } from './orders.environment';
import { ordersTables, schemaStatements, seedStatements } from './orders.tables';
import { query } from './sql-dialect';

/**
 * Creates the business tables (if absent) and stocks the catalogue, in the outbox store's
 * database, before the HTTP server takes requests. At bootstrap rather than module init: by then
 * every `@InboxHandler` is registered, so the first use of the store starts its inbox too.
 */
@Injectable()
export class OrdersSchema implements OnApplicationBootstrap {
  constructor(
    private readonly outbox: OutboxService,
    @Inject(ORDERS_SETTINGS) private readonly settings: OrdersSettings,
  ) {}

  async onApplicationBootstrap(): Promise<void> {
    const tables = ordersTables(this.settings.tablePrefix);
    await this.outbox.transaction(async (tx) => {
      for (const statement of schemaStatements(tables)) await query(tx, statement);
      for (const { sql, params } of seedStatements(tables)) await query(tx, sql, params);
    });
  }
}
