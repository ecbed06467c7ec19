import { Module } from '@nestjs/common';
import { PacsRouterService } from './pacs-router.service';

/** The producing role: sends studies to `imaging.ai.intake`. */
@Module({ providers: [PacsRouterService], exports: [PacsRouterService] })
export class PacsRouterModule {}
