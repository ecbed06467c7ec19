import type { INestMicroservice, LogLevel, Provider, Type } from '@nestjs/common';
import { ClientsModule } from '@nestjs/microservices';
import { Test } from '@nestjs/testing';
import { SequenceModule, type SequenceModuleOptions } from 'nest-sequence';
import {
  SequenceClient,
  SequenceServer,
  type SequenceClientOptions,
  type SequenceServerOptions,
} from 'nest-sequence/microservices';

/** The injection token of the test apps' client. */
export const CLIENT = 'SEQUENCE_CLIENT';

export interface MicroserviceTestAppOptions {
  readonly sequence: SequenceModuleOptions;
  readonly controllers?: Type[];
  readonly providers?: Provider[];
  readonly server?: SequenceServerOptions;
  readonly client?: SequenceClientOptions;
  readonly logger?: false | LogLevel[];
  /** Called before the app listens: global pipes, filters... */
  readonly configure?: (app: INestMicroservice) => void;
}

export interface MicroserviceTestApp {
  readonly app: INestMicroservice;
  readonly client: SequenceClient;
  close(): Promise<void>;
}

/**
 * A Nest microservice served by `SequenceServer` over `SequenceModule.forRoot(options.sequence)`,
 * with a `SequenceClient` registered through `ClientsModule` (token {@link CLIENT}), listening.
 */
export async function createMicroserviceTestApp(
  options: MicroserviceTestAppOptions,
): Promise<MicroserviceTestApp> {
  const moduleRef = await Test.createTestingModule({
    imports: [
      SequenceModule.forRoot(options.sequence),
      ClientsModule.register([
        { name: CLIENT, customClass: SequenceClient, options: options.client ?? {} },
      ]),
    ],
    controllers: options.controllers ?? [],
    providers: options.providers ?? [],
  }).compile();
  const app = moduleRef.createNestMicroservice({
    strategy: new SequenceServer(options.server),
    logger: options.logger ?? ['error'],
  });
  options.configure?.(app);
  try {
    await app.listen();
  } catch (error) {
    await app.close().catch(() => undefined);
    throw error;
  }
  const client = app.get<SequenceClient>(CLIENT);
  return { app, client, close: () => app.close() };
}
