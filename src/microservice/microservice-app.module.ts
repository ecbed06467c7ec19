import { Module } from '@nestjs/common';
import { ClientsModule } from '@nestjs/microservices';
import { SequenceModule } from 'nest-sequence';
import { SequenceClient } from 'nest-sequence/microservices';
import type { NatsTransport } from 'nest-sequence/nats';
import type { Registry } from 'prom-client';
import { demoSequenceOptions } from '../app.module';
import {
  DEMO_ADAPTERS,
  DEMO_METRICS,
  InfrastructureModule,
  type DemoAdapters,
} from '../infrastructure';
import { DEMO_NATS_TRANSPORT, NatsSelectionModule } from './nats.selection';
import { StudyIntakeController } from './study-intake.controller';
import { StudyIntakeLedger } from './study-intake.ledger';
import { IMAGING_CLIENT, StudySender } from './study.sender';

/** The receiving role: `@EventPattern('imaging.ai.intake')`, served by `SequenceServer`. */
@Module({
  controllers: [StudyIntakeController],
  providers: [StudyIntakeLedger],
  exports: [StudyIntakeLedger],
})
export class StudyIntakeModule {}

/** The sending role: a `SequenceClient` registered through `ClientsModule`. */
@Module({
  imports: [
    ClientsModule.register([{ name: IMAGING_CLIENT, customClass: SequenceClient, options: {} }]),
  ],
  providers: [StudySender],
  exports: [StudySender],
})
export class StudySenderModule {}

/**
 * Both roles in one Nest microservice, on the imaging demo's SequenceModule options and adapters
 * (infrastructure.ts), or on NATS JetStream with `NATS_URL`: its fragments then take the
 * transport's default size, the server's `max_payload` less room for the headers.
 */
@Module({
  imports: [
    SequenceModule.forRootAsync({
      imports: [InfrastructureModule, NatsSelectionModule],
      inject: [DEMO_ADAPTERS, DEMO_METRICS, DEMO_NATS_TRANSPORT],
      useFactory: (adapters: DemoAdapters, registry: Registry, nats: NatsTransport | null) => {
        const options = demoSequenceOptions(adapters, registry);
        if (!nats) return options;
        return {
          ...options,
          transport: nats,
          sequence: { ...options.sequence, fragmentBytes: undefined },
        };
      },
    }),
    StudyIntakeModule,
    StudySenderModule,
  ],
})
export class MicroserviceAppModule {}
