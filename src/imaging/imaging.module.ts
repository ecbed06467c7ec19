import { Module } from '@nestjs/common';
import { AiService } from './ai.service';
import { PacsRouterService } from './pacs-router.service';

@Module({ providers: [PacsRouterService, AiService], exports: [PacsRouterService] })
export class ImagingModule {}
