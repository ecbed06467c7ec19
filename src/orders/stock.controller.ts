import { Controller, Get, NotFoundException, Param } from '@nestjs/common';
import type { StockView } from './orders.model';
import { OrdersService } from './orders.service';

/** What is left of each product, and what orders hold reserved. */
@Controller('stock')
export class StockController {
  constructor(private readonly orders: OrdersService) {}

  /** `{ sku, available, reserved }`; 404 for a product the catalogue lacks. */
  @Get(':sku')
  async find(@Param('sku') sku: string): Promise<StockView> {
    const stock = await this.orders.stock(sku);
    if (!stock) throw new NotFoundException(`no product ${sku} in stock`);
    return stock;
  }
}
