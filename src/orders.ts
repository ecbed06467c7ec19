import 'reflect-metadata';
import { OrdersAppModule } from './app.module';
import { runHttpScenario, runUntilServingOrDone } from './demo.command';
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
  return runHttpScenario({
    module: OrdersAppModule.register(environment),
    port: environment.port,
    serve: environment.serve,
    listening: (port) => `orders API on http://localhost:${port}/orders`,
    serving: (port) => `serving http://localhost:${port}/orders and /stock until Ctrl-C (SERVE=1)`,
    run: async (app, base) => {
      const run = await runOrdersScenario(app, base, environment.orders, environment);
      return { lines: describeRun(run), problems: failedChecks(run) };
    },
  });
}

runUntilServingOrDone(main);
