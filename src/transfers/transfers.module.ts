import { Module, type DynamicModule } from '@nestjs/common';
import { TransferStatusProjection } from './transfer-status.projection';
import { TransferStatusResequencer } from './transfer-status.resequencer';
import { TRANSFERS_SETTINGS } from './transfers.constants';
import { TransfersController } from './transfers.controller';
import type { TransfersSettings } from './transfers.environment';
import { UpstreamSimulator } from './upstream.simulator';

/**
 * The instant-payment transfers demo: upstream services publish statuses shuffled, the
 * resequencer puts each transfer's back in order, the projection serves them over HTTP. Needs
 * `SequenceModule` (global) for the transport and `ResequencerService`.
 */
@Module({})
export class TransfersModule {
  static register(settings: TransfersSettings): DynamicModule {
    return {
      module: TransfersModule,
      controllers: [TransfersController],
      providers: [
        { provide: TRANSFERS_SETTINGS, useValue: settings },
        TransferStatusResequencer,
        TransferStatusProjection,
        UpstreamSimulator,
      ],
      exports: [TransferStatusProjection, TransferStatusResequencer, UpstreamSimulator],
    };
  }
}
