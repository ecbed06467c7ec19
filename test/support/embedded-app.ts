import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { DynamicModule, INestApplication } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { DEMO_ADAPTERS } from '../../src/infrastructure';

/**
 * A demo app module in this process on the embedded defaults (no adapters from the environment),
 * listening on a free port: the app, and the base URL of its API.
 */
export async function listenEmbedded(
  module: DynamicModule,
): Promise<{ app: INestApplication; base: string }> {
  const moduleRef = await Test.createTestingModule({ imports: [module] })
    .overrideProvider(DEMO_ADAPTERS)
    .useValue({})
    .compile();
  const app = moduleRef.createNestApplication({ logger: false });
  await app.listen(0);
  const { port } = (app.getHttpServer() as Server).address() as AddressInfo;
  return { app, base: `http://127.0.0.1:${port}` };
}
