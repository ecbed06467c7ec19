import { Module } from '@nestjs/common';
import { SequenceModule } from 'nest-sequence';
import { AiModule } from './imaging/ai.module';
import { PacsRouterModule } from './imaging/pacs-router.module';
import { DEMO_ADAPTERS, InfrastructureModule, type DemoAdapters } from './infrastructure';

/** Message Sequence on the adapters the environment chooses (see infrastructure.ts). */
const Sequence = SequenceModule.forRootAsync({
  imports: [InfrastructureModule],
  inject: [DEMO_ADAPTERS],
  useFactory: (adapters: DemoAdapters) => adapters,
  isGlobal: true,
});

/** Both roles in one process: `npm start`. */
@Module({ imports: [Sequence, PacsRouterModule, AiModule] })
export class AppModule {}

/** The AI service alone: `npm run demo:consumer`. */
@Module({ imports: [Sequence, AiModule] })
export class ConsumerAppModule {}

/** The PACS router alone: `npm run demo:producer`. */
@Module({ imports: [Sequence, PacsRouterModule] })
export class ProducerAppModule {}
