import { Module } from '@nestjs/common';
import { ClientsModule } from '@nestjs/microservices';
import { SequenceModule } from 'nest-sequence';
import { SequenceClient } from 'nest-sequence/microservices';
import type { Registry } from 'prom-client';
import { demoSequenceOptions } from '../app.module';
import {
  DEMO_ADAPTERS,
  DEMO_METRICS,
  InfrastructureModule,
  type DemoAdapters,
} from '../infrastructure';
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
 * (infrastructure.ts: the in-memory transport, RabbitMQ with `AMQP_URL` or NATS JetStream with
 * `NATS_URL`).
 */
@Module({
  imports: [
    SequenceModule.forRootAsync({
      imports: [InfrastructureModule],
      inject: [DEMO_ADAPTERS, DEMO_METRICS],
      useFactory: (adapters: DemoAdapters, registry: Registry) =>
        demoSequenceOptions(adapters, registry),
    }),
    StudyIntakeModule,
    StudySenderModule,
  ],
})
export class MicroserviceAppModule {}
