import {
  Body,
  Controller,
  Get,
  HttpStatus,
  NotFoundException,
  Param,
  Post,
  UnprocessableEntityException,
  ValidationPipe,
} from '@nestjs/common';
import type { OrderView } from './orders.model';
import { OrdersService } from './orders.service';
import { PlaceOrderDto } from './place-order.dto';
import { UnknownSkuError } from './unknown-sku.error';

/** Unknown properties are refused rather than dropped: a typo in a field name is a 400. */
const BODY = new ValidationPipe({ whitelist: true, forbidNonWhitelisted: true, transform: true });

/** Placing orders, and following what became of them. */
@Controller('orders')
export class OrdersController {
  constructor(private readonly orders: OrdersService) {}

  /**
   * `{ items: [{ sku, qty }] }` → 201 with the order, `PLACED`; its stock is reserved (or the
   * order rejected) shortly after. 400 for a malformed body, 422 for an unknown sku (nothing is
   * recorded then).
   */
  @Post()
  async place(@Body(BODY) body: PlaceOrderDto): Promise<OrderView> {
    try {
      return await this.orders.place(body.items);
    } catch (error) {
      if (!(error instanceof UnknownSkuError)) throw error;
      throw new UnprocessableEntityException({
        statusCode: HttpStatus.UNPROCESSABLE_ENTITY,
        error: 'Unprocessable Entity',
        message: error.message,
        sku: error.sku,
        orderId: error.orderId,
      });
    }
  }

  /** The order, its lines, and the stock side's decision (`reservation`, null until made). */
  @Get(':id')
  async find(@Param('id') id: string): Promise<OrderView> {
    const order = await this.orders.find(id);
    if (!order) throw new NotFoundException(`no order ${id}`);
    return order;
  }
}
