import { Type } from 'class-transformer';
import {
  ArrayMaxSize,
  ArrayMinSize,
  ArrayUnique,
  IsArray,
  IsInt,
  IsString,
  Matches,
  Max,
  Min,
  ValidateNested,
} from 'class-validator';

/** Product codes: upper-case letters, digits and dashes (`KEYBOARD-TKL`). */
export const SKU_PATTERN = /^[A-Z0-9][A-Z0-9-]{0,39}$/;
export const MAX_LINES = 20;
export const MAX_QTY = 1_000;

/** One line of `POST /orders`. */
export class OrderLineDto {
  @Matches(SKU_PATTERN, {
    message: 'sku must be 1-40 upper-case letters, digits and dashes, e.g. KEYBOARD-TKL',
  })
  @IsString()
  sku!: string;

  @Max(MAX_QTY)
  @Min(1)
  @IsInt()
  qty!: number;
}

/** The body of `POST /orders`: `{ items: [{ sku, qty }] }`, each sku at most once. */
export class PlaceOrderDto {
  @ValidateNested({ each: true })
  @Type(() => OrderLineDto)
  @ArrayUnique((line: OrderLineDto) => line?.sku, { message: 'items must name each sku once' })
  @ArrayMaxSize(MAX_LINES)
  @ArrayMinSize(1)
  @IsArray()
  items!: OrderLineDto[];
}
