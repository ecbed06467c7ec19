import { Controller, Get, NotFoundException, Param } from '@nestjs/common';
import {
  TransferStatusProjection,
  type TransferView,
  type TransfersSummary,
} from './transfer-status.projection';

/** The read API over the projection: what a payer's app would poll. */
@Controller('transfers')
export class TransfersController {
  constructor(private readonly projection: TransferStatusProjection) {}

  /** Counts by status, what the projection refused, and the open gaps. */
  @Get()
  summary(): TransfersSummary {
    return this.projection.summary();
  }

  /** `{ id, status, seq, gap?: { expected, since } }`; 404 for a transfer never heard of. */
  @Get(':id/status')
  status(@Param('id') id: string): TransferView {
    const view = this.projection.get(id);
    if (!view) throw new NotFoundException(`no status of transfer ${id} has arrived`);
    return view;
  }
}
