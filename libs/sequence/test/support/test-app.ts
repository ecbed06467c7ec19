import type { INestApplicationContext, LogLevel, ModuleMetadata, Provider } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { SequenceModule, type SequenceModuleOptions } from 'nest-sequence';

/** Closes one thing a test opened: a transport, a client, a temporary directory. */
export type Closer = () => unknown;

type Imports = NonNullable<ModuleMetadata['imports']>;

export interface TestAppOptions {
  /** What `SequenceModule.forRoot` gets. */
  readonly sequence: SequenceModuleOptions;
  /** Handler providers and any others the app needs. */
  readonly providers?: Provider[];
  /** Modules imported before SequenceModule (e.g. `ScheduleModule.forRoot()`). */
  readonly importsBefore?: Imports;
  /** Modules imported after SequenceModule. */
  readonly imports?: Imports;
  /** Nest's logger: `false` silences it, levels select; left out, Nest's default logger. */
  readonly logger?: false | LogLevel[];
  /**
   * What the caller opened for this app, in the order it opened them. They are closed after the
   * app, in reverse order, and also when the app fails to boot.
   */
  readonly resources?: readonly Closer[];
}

export interface TestApp {
  readonly app: INestApplicationContext;
  /**
   * Hands the app something more to close (after it, before the resources it booted with): for
   * what must stay open when the boot fails, e.g. a transport the caller closes then.
   */
  own(closer: Closer): void;
  /** Closes the app, then what it owns and its resources, last opened first, each even if another fails. */
  close(): Promise<void>;
}

/**
 * Runs every closer, last first, each even if one before it throws; then throws the error (or an
 * AggregateError of the errors) if any did.
 */
export async function closeAll(closers: readonly Closer[]): Promise<void> {
  const errors: unknown[] = [];
  for (const close of [...closers].reverse()) {
    try {
      await close();
    } catch (error) {
      errors.push(error);
    }
  }
  if (errors.length === 1) throw errors[0];
  if (errors.length > 1) throw new AggregateError(errors, `${errors.length} closers failed`);
}

/**
 * The one builder of the tests' Nest applications: a testing module with
 * `SequenceModule.forRoot(options.sequence)` and the given providers, initialised. The
 * pattern helpers (`createSequenceTestApp`, `createClaimCheckTestApp`, …) wrap it with their
 * defaults and recording handlers. A failed boot closes the resources before rethrowing.
 */
export async function createTestApp(options: TestAppOptions): Promise<TestApp> {
  const resources = options.resources ?? [];
  let app: INestApplicationContext;
  try {
    const moduleRef = await Test.createTestingModule({
      imports: [
        ...(options.importsBefore ?? []),
        SequenceModule.forRoot(options.sequence),
        ...(options.imports ?? []),
      ],
      providers: options.providers ?? [],
    }).compile();
    if (options.logger !== undefined) moduleRef.useLogger(options.logger);
    app = await moduleRef.init();
  } catch (error) {
    await closeAll(resources).catch(() => undefined);
    throw error;
  }
  const owned: Closer[] = [];
  return {
    app,
    own: (closer) => void owned.push(closer),
    close: () => closeAll([...resources, ...owned, () => app.close()]),
  };
}
