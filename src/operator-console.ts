import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Module, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { SequenceAdminModule } from 'nest-sequence/admin';
import { AppModule } from './app.module';
import { closeOnSignals } from './demo.command';
import { checkDemoServers } from './demo-servers';

/** The imaging demo and the operator console over the same module, in one HTTP application. */
@Module({ imports: [AppModule, SequenceAdminModule.forRoot()] })
class ConsoleAppModule {}

/**
 * `npm start` with CONSOLE_PORT: the imaging demo as an HTTP application that serves the operator
 * console at http://127.0.0.1:<port>/sequence-admin/ (its API under /sequence-admin/api/). It
 * listens on the loopback interface only: with no guard, the console answers loopback only
 * anyway, and read-only (mutations are off unless an application turns them on). Ctrl-C (or
 * SIGTERM) closes it: exit code 0 once `serving` (the run is over), 130 (143) during the run.
 */
export async function serveConsole(
  port: number,
  serving: () => boolean,
): Promise<INestApplication> {
  await checkDemoServers(process.env);
  const app = await NestFactory.create(ConsoleAppModule, { logger: ['error', 'warn'] });
  closeOnSignals(app, serving);
  await app.listen(port, '127.0.0.1');
  const { port: listening } = (app.getHttpServer() as Server).address() as AddressInfo;
  console.log(`operator console on http://127.0.0.1:${listening}/sequence-admin/`);
  return app;
}
