import 'reflect-metadata';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  ConsoleLogger,
  type DynamicModule,
  type INestApplication,
  type INestApplicationContext,
  type LoggerService,
  type LogLevel,
  type Type,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { DemoEnvironmentError } from './demo-environment.error';
import { checkDemoServers, DemoServerError } from './demo-servers';
import { readDemoEnvironment } from './demo.environment';
import { flushDemoTracing, startDemoTracing } from './tracing';

startDemoTracing();

/** Exit code of a command used wrongly (bad arguments or environment). */
export const USAGE_ERROR = 2;

/**
 * The application context of one demo command, on the adapters the environment chooses. The
 * environment is checked first, so that a bad setting ends the command with a line saying what to
 * fix instead of a stack trace from inside Nest's bootstrap.
 */
export async function createDemoApp(
  module: Type,
  logger: LogLevel[] | LoggerService = ['error', 'warn', 'log'],
): Promise<INestApplicationContext> {
  readDemoEnvironment(process.env);
  await checkDemoServers(process.env);
  return NestFactory.createApplicationContext(module, { logger });
}

/**
 * Closes `app` on SIGINT or SIGTERM, then ends the process: with 0 once the run is over and the
 * app only goes on serving (how such a demo is stopped), else with 128 + the signal's number (130,
 * 143), as a shell reports a command it interrupted.
 */
export function closeOnSignals(app: INestApplicationContext, serving: () => boolean): void {
  for (const [signal, code] of [
    ['SIGINT', 130],
    ['SIGTERM', 143],
  ] as const) {
    process.once(signal, () => {
      void closeQuietly(app).finally(() => process.exit(serving() ? 0 : code));
    });
  }
}

/**
 * Nest's console logger, every level on stderr (Nest writes all but errors to stdout): for a
 * command whose stdout carries its result alone.
 */
export class StderrLogger extends ConsoleLogger {
  protected override printMessages(...args: Parameters<ConsoleLogger['printMessages']>): void {
    super.printMessages(args[0], args[1], args[2], 'stderr', args[4]);
  }
}

/**
 * Runs a command that finishes: exits with the code it resolves to, or 1 (printing the error)
 * when it fails.
 */
export function runToCompletion(command: () => Promise<number>): void {
  command().then(async (code) => {
    await flushDemoTracing();
    process.exit(code);
  }, exitOnError);
}

/**
 * Runs a command that either finishes (exits with the code it resolves to) or goes on serving
 * (`'serving'`: the process stays up until a signal); 1, printing the error, when it fails.
 */
export function runUntilServingOrDone(command: () => Promise<number | 'serving'>): void {
  command().then(async (outcome) => {
    if (outcome === 'serving') return;
    await flushDemoTracing();
    process.exit(outcome);
  }, exitOnError);
}

/** What a demo scenario ran: the summary lines it prints, and the checks that failed. */
export interface ScenarioReport {
  readonly lines: readonly string[];
  readonly problems: readonly string[];
}

export interface HttpScenario {
  readonly module: DynamicModule;
  readonly port: number;
  /** Keep serving after the checks passed (SERVE=1). */
  readonly serve: boolean;
  /** The line printed once the app listens, and the one printed when it goes on serving. */
  readonly listening: (port: number) => string;
  readonly serving: (port: number) => string;
  /** Runs the scenario against the app, whose API answers at `base`. */
  readonly run: (app: INestApplication, base: string) => Promise<ScenarioReport>;
}

/**
 * A demo with an HTTP API: starts the app (closed, and the process ended, on SIGINT or SIGTERM:
 * see {@link closeOnSignals}), runs the scenario, prints its summary and any failed check.
 * Resolves to the exit code (0 when every check passed) after closing the app, or to `'serving'`
 * with `serve`, leaving it up.
 */
export async function runHttpScenario(scenario: HttpScenario): Promise<'serving' | number> {
  await checkDemoServers(process.env);
  const app = await NestFactory.create(scenario.module, { logger: ['error', 'warn'] });
  let serving = false;
  closeOnSignals(app, () => serving);
  try {
    await app.listen(scenario.port);
    const { port } = (app.getHttpServer() as Server).address() as AddressInfo;
    console.log(scenario.listening(port));

    const report = await scenario.run(app, `http://127.0.0.1:${port}`);
    console.log(report.lines.join('\n'));
    if (report.problems.length > 0) {
      for (const problem of report.problems) console.error(`check failed: ${problem}`);
      return 1;
    }
    console.log('all checks passed');
    if (!scenario.serve) return 0;
    console.log(scenario.serving(port));
    serving = true;
    return 'serving';
  } finally {
    if (!serving) await closeQuietly(app);
  }
}

/** Closes an application without letting a failure to close hide why the run failed. */
export async function closeQuietly(app: INestApplicationContext): Promise<void> {
  await app.close().catch((error: unknown) => console.error('closing the app failed:', error));
}

/**
 * Ends the command: a usage error (exit 2) for a bad environment, 1 with a line per server for one
 * it cannot reach, else 1 with the error.
 */
export function exitOnError(error: unknown): never {
  if (error instanceof DemoEnvironmentError) {
    console.error(error.message);
    process.exit(USAGE_ERROR);
  }
  if (error instanceof DemoServerError) {
    console.error(error.message);
    process.exit(1);
  }
  console.error(error);
  process.exit(1);
}

/** Producer and consumer run as separate processes: they only meet through a real broker. */
export function requireBroker(command: string): void {
  if (process.env.AMQP_URL || process.env.NATS_URL) return;
  console.error(
    `${command} talks to the other side through a broker: set AMQP_URL for RabbitMQ ` +
      `(e.g. AMQP_URL=amqp://guest:guest@localhost:5672) or NATS_URL for NATS JetStream ` +
      `(e.g. NATS_URL=nats://localhost:4222), and REDIS_URL for a shared store. ` +
      `To run both sides in one process without servers, use npm start.`,
  );
  process.exit(USAGE_ERROR);
}

/**
 * Producer and consumer run as separate processes: a ticket signed by one must verify in the
 * other, so both need the same key. Without one each process would sign with a random key of its
 * own, and every study sent through the claim check would be dead-lettered as signed by an
 * unknown key; refusing to start says so before any study is lost.
 */
export function requireSharedKey(command: string): void {
  if (process.env.CLAIM_CHECK_KEY) return;
  console.error(
    `${command} signs or verifies claim tickets with a key the other side must share: set ` +
      `CLAIM_CHECK_KEY to the same secret of at least 32 bytes for demo:producer and ` +
      `demo:consumer (e.g. export CLAIM_CHECK_KEY=$(openssl rand -base64 32)).`,
  );
  process.exit(USAGE_ERROR);
}
