import { Module } from '@nestjs/common';
import { AiService } from './ai.service';

/** The consuming role: analyses studies from `imaging.ai.intake`, reports to `imaging.ai.results`. */
@Module({ providers: [AiService] })
export class AiModule {}
