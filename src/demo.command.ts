import 'reflect-metadata';
import type { INestApplicationContext, LogLevel, Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';

/** Exit code of a command used wrongly (bad arguments or environment). */
export const USAGE_ERROR = 2;

/** The application context of one demo command, on the adapters the environment chooses. */
export function createDemoApp(
  module: Type,
  logger: LogLevel[] = ['error', 'warn', 'log'],
): Promise<INestApplicationContext> {
  return NestFactory.createApplicationContext(module, { logger });
}

/**
 * Runs a command that finishes: exits with the code it resolves to, or 1 (printing the error)
 * when it fails.
 */
export function runToCompletion(command: () => Promise<number>): void {
  command().then((code) => process.exit(code), exitOnError);
}

export function exitOnError(error: unknown): never {
  console.error(error);
  process.exit(1);
}

/** Producer and consumer run as separate processes: they only meet through a real broker. */
export function requireBroker(command: string): void {
  if (process.env.AMQP_URL) return;
  console.error(
    `${command} talks to the other side through RabbitMQ: set AMQP_URL ` +
      `(e.g. AMQP_URL=amqp://guest:guest@localhost:5672), and REDIS_URL for a shared store. ` +
      `To run both sides in one process without servers, use npm start.`,
  );
  process.exit(USAGE_ERROR);
}
