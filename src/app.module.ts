import { Module, type DynamicModule } from '@nestjs/common';
import { SequenceModule, type SequenceModuleOptions, type Transport } from 'nest-sequence';
import { MAX_SEQUENCE_BYTES, readDemoEnvironment } from './demo.environment';
import { MetricsEndpointModule } from './metrics-endpoint';
import { AiModule } from './imaging/ai.module';
import { PacsRouterModule } from './imaging/pacs-router.module';
import type { Registry } from 'prom-client';
import {
  DEMO_ADAPTERS,
  DEMO_METRICS,
  InfrastructureModule,
  type DemoAdapters,
} from './infrastructure';
import type { OrdersSettings } from './orders/orders.environment';
import { OrdersModule, ordersOutboxOptions } from './orders/orders.module';
import type { TransfersSettings } from './transfers/transfers.environment';
import { TransfersModule } from './transfers/transfers.module';

/**
 * Largest fragment of a study sent as a sequence: half the RabbitMQ transport's default message
 * limit (16 MiB), so that a fragment never comes near it.
 */
const FRAGMENT_BYTES = 8 * 1024 * 1024;

/**
 * {@link FRAGMENT_BYTES} on a transport that takes twice that (RabbitMQ, the in-memory one);
 * otherwise (NATS: its server's `max_payload`, 1 MiB by default) undefined, so that the module
 * derives the fragment size from the transport's `maxMessageBytes`.
 */
function fragmentBytesFor(transport?: Transport): number | undefined {
  return !transport || transport.maxMessageBytes >= 2 * FRAGMENT_BYTES ? FRAGMENT_BYTES : undefined;
}

/** The module's options: the adapters the environment chooses, and the demo's settings. */
export function demoSequenceOptions(
  adapters: DemoAdapters,
  registry: Registry,
  env: NodeJS.ProcessEnv = process.env,
): SequenceModuleOptions {
  const { claimCheckAboveBytes, signingKeys } = readDemoEnvironment(env);
  return {
    metrics: { registry },
    transport: adapters.transport,
    stores: adapters.stores,
    sequence: {
      fragmentBytes: fragmentBytesFor(adapters.transport),
      maxSequenceBytes: MAX_SEQUENCE_BYTES,
    },
    claimCheck: {
      store: adapters.payloadStore,
      sequenceMaxBytes: claimCheckAboveBytes,
      signingKeys,
    },
  };
}

/**
 * SequenceModule on the adapters the environment chooses (see infrastructure.ts), with an app's
 * own options on top.
 */
function sequenceModule(
  more: (adapters: DemoAdapters) => SequenceModuleOptions = () => ({}),
): DynamicModule {
  return SequenceModule.forRootAsync({
    imports: [InfrastructureModule],
    inject: [DEMO_ADAPTERS, DEMO_METRICS],
    useFactory: (adapters: DemoAdapters, registry: Registry) => ({
      ...demoSequenceOptions(adapters, registry),
      ...more(adapters),
    }),
    isGlobal: true,
  });
}

/** Message Sequence, Claim Check and Resequencer on the adapters the environment chooses (see infrastructure.ts). */
const Sequence = sequenceModule();

/** Both roles in one process: `npm start`. */
@Module({ imports: [Sequence, MetricsEndpointModule, PacsRouterModule, AiModule] })
export class AppModule {}

/** The AI service alone: `npm run demo:consumer`. */
@Module({ imports: [Sequence, MetricsEndpointModule, AiModule] })
export class ConsumerAppModule {}

/** The PACS router alone: `npm run demo:producer`. */
@Module({ imports: [Sequence, MetricsEndpointModule, PacsRouterModule] })
export class ProducerAppModule {}

/** The instant-payment transfers demo, with its HTTP API: `npm run demo:transfers`. */
@Module({})
export class TransfersAppModule {
  static register(settings: TransfersSettings): DynamicModule {
    return {
      module: TransfersAppModule,
      imports: [Sequence, MetricsEndpointModule, TransfersModule.register(settings)],
    };
  }
}

/**
 * The orders demo (Outbox / Inbox), with its HTTP API: `npm run demo:orders`. Its own
 * SequenceModule: only this app configures the outbox, which would otherwise start (and, on
 * PostgreSQL, create its tables) in every demo.
 */
@Module({})
export class OrdersAppModule {
  static register(settings: OrdersSettings): DynamicModule {
    const sequence = sequenceModule(() => ({
      outbox: ordersOutboxOptions(settings),
    }));
    return {
      module: OrdersAppModule,
      imports: [sequence, MetricsEndpointModule, OrdersModule.register(settings)],
    };
  }
}
