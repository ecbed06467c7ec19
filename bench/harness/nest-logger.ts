/**
 * Nest's and the library's log lines on stderr: stdout carries only a benchmark's JSON result
 * lines. Kept apart from log.ts, which baseline child processes load without Nest.
 */
import { ConsoleLogger } from '@nestjs/common';

/** A Nest logger that writes every level to stderr (ConsoleLogger writes most to stdout). */
export class StderrLogger extends ConsoleLogger {
  protected override printMessages(...args: Parameters<ConsoleLogger['printMessages']>): void {
    super.printMessages(args[0], args[1], args[2], 'stderr', args[4]);
  }
}

/** Warnings and errors only, on stderr: for `Logger.overrideLogger` and `{ logger }` options. */
export function nestLogger(context: string): StderrLogger {
  return new StderrLogger(context, { logLevels: ['error', 'warn'] });
}
