import 'reflect-metadata';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { NestFactory } from '@nestjs/core';
import { OrdersAppModule } from './app.module';
import { closeQuietly, runUntilServingOrDone } from './demo.command';
import { readDemoEnvironment } from './demo.environment';
import { runOrdersScenario } from './orders/orders-demo.scenario';
import { describeRun, failedChecks } from './orders/orders-run.report';
import { readOrdersEnvironment } from './orders/orders.environment';

/**
 * `npm run demo:orders`: the Transactional Outbox and the Inbox. Places ORDERS orders over HTTP,
 * each stored with its `OrderPlaced` event in one transaction; the relay publishes the events and
 * the inbox hands each once to the stock side, which reserves stock in the transaction that marks
 * the event handled. Then publishes one event again straight to the broker (the inbox drops it),
 * orders more of a product than is left (rejected), and names an unknown sku (rolled back,
 * nothing published). Prints a summary, checks it, and exits (0 when every check passed), or
 * keeps serving with SERVE=1.
 */
async function main(): Promise<'serving' | number> {
  const environment = readOrdersEnvironment(process.env);
  readDemoEnvironment(process.env); // the shared module reads it too: a usage error, not a trace
  const app = await NestFactory.create(OrdersAppModule.register(environment), {
    logger: ['error', 'warn'],
  });
  // On a signal: stop consuming, close, exit 0.
  app.enableShutdownHooks(['SIGINT', 'SIGTERM'], { useProcessExit: true });
  let serving = false;
  try {
    await app.listen(environment.port);
    const { port } = (app.getHttpServer() as Server).address() as AddressInfo;
    console.log(`orders API on http://localhost:${port}/orders`);

    const run = await runOrdersScenario(
      app,
      `http://127.0.0.1:${port}`,
      environment.orders,
      environment,
    );
    console.log(describeRun(run).join('\n'));

    const problems = failedChecks(run);
    if (problems.length > 0) {
      for (const problem of problems) console.error(`check failed: ${problem}`);
      return 1;
    }
    console.log('all checks passed');
    if (!environment.serve) return 0;
    console.log(`serving http://localhost:${port}/orders and /stock until Ctrl-C (SERVE=1)`);
    serving = true;
    return 'serving';
  } finally {
    if (!serving) await closeQuietly(app);
  }
}

runUntilServingOrDone(main);
