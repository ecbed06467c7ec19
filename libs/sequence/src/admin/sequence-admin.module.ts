import {
  Controller,
  type DynamicModule,
  type InjectionToken,
  Module,
  type OptionalFactoryDependency,
  type Provider,
  type Type,
} from '@nestjs/common';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { optionsObjectProblem } from '../options/option-keys';
import { AdminAccessGuard, UnguardedActionsWarning } from './admin-access.guard';
import { AdminActions } from './admin-actions';
import { AdminBodyErrors } from './admin-body-errors';
import { AdminErrorFilter } from './admin-error.filter';
import {
  ADMIN_GUARD,
  ADMIN_OPTIONS,
  resolveAdminOptions,
  type SequenceAdminOptions,
} from './admin.options';
import { BoxesReader } from './boxes.reader';
import { ConsolePageController } from './console/console-page.controller';
import { ClaimsReader } from './claims.reader';
import { DeadLettersController } from './dead-letters.controller';
import { DeadLettersReader } from './dead-letters.reader';
import { FindReader } from './find.reader';
import { InspectController } from './inspect.controller';
import { OverviewReader } from './overview.reader';
import { RepairsController } from './repairs.controller';
import { ResequencerReader } from './resequencer.reader';
import { SequencesReader } from './sequences.reader';

/** What `forRootAsync` takes from a factory: everything but where and who. */
export type SequenceAdminFactoryOptions = Omit<SequenceAdminOptions, 'path' | 'guard' | 'imports'>;

/** Options of `SequenceAdminModule.forRootAsync`: the mount path and guard are given up front. */
export interface SequenceAdminAsyncOptions extends Pick<
  SequenceAdminOptions,
  'path' | 'guard' | 'imports'
> {
  useFactory: (
    ...args: never[]
  ) => SequenceAdminFactoryOptions | Promise<SequenceAdminFactoryOptions>;
  inject?: Array<InjectionToken | OptionalFactoryDependency>;
}

/** The API's controllers, in the order their routes are registered. */
const API_CONTROLLERS: readonly Type[] = [
  InspectController,
  DeadLettersController,
  RepairsController,
];

const READERS: Provider[] = [
  AdminActions,
  AdminAccessGuard,
  AdminErrorFilter,
  AdminBodyErrors,
  SequencesReader,
  DeadLettersReader,
  ResequencerReader,
  BoxesReader,
  ClaimsReader,
  FindReader,
  OverviewReader,
];

/** A subclass of `base` mounted under `prefix` (each forRoot its own path). */
function mounted(base: Type, prefix: string): Type {
  const controller = class extends (base as new (...args: never[]) => object) {};
  Object.defineProperty(controller, 'name', { value: base.name });
  Controller(prefix)(controller);
  return controller;
}

function guardProviders(guard: SequenceAdminOptions['guard']): Provider[] {
  if (guard === undefined) return [UnguardedActionsWarning];
  if (typeof guard === 'function') {
    return [guard, { provide: ADMIN_GUARD, useExisting: guard }];
  }
  return [{ provide: ADMIN_GUARD, useValue: guard }];
}

/**
 * The operator console's API (`nest-sequence/admin`): open sequences, dead letters, resequencer
 * gaps, failed outbox and inbox rows, claim-check payloads, and finding any of them by id, as JSON
 * under `/<path>/api/`. Read-only unless `mutations: true`; served to loopback clients only unless
 * the app supplies a `guard`. Every action is recorded as an `admin.action` lifecycle event.
 *
 * It reads the stores and transport of the application's `SequenceModule`, which must be
 * registered with `isGlobal: true`.
 *
 * @example
 * SequenceAdminModule.forRoot({ guard: OperatorsGuard, mutations: true })
 */
@Module({})
export class SequenceAdminModule {
  /** @throws SequenceOptionsError when an option is invalid (every problem listed) */
  static forRoot(options: SequenceAdminOptions = {}): DynamicModule {
    const resolved = resolveAdminOptions(options);
    return SequenceAdminModule.build(resolved.path, options, [
      { provide: ADMIN_OPTIONS, useValue: resolved },
    ]);
  }

  /** As `forRoot`, with the options besides `path`, `guard` and `imports` from a factory. */
  static forRootAsync(options: SequenceAdminAsyncOptions): DynamicModule {
    const { path } = resolveAdminOptions({ path: options.path, guard: options.guard });
    return SequenceAdminModule.build(path, options, [
      {
        provide: ADMIN_OPTIONS,
        inject: options.inject ?? [],
        useFactory: async (...args: never[]) => {
          const given: unknown = await options.useFactory(...args);
          // Spread, a factory's undefined (a missing return) or string would pass for defaults.
          const notAnObject = optionsObjectProblem(given);
          if (notAnObject)
            throw new SequenceOptionsError('SequenceAdminModule options', [notAnObject]);
          return resolveAdminOptions({
            ...(given as SequenceAdminFactoryOptions),
            path: options.path,
            guard: options.guard,
          });
        },
      },
    ]);
  }

  private static build(
    path: string,
    options: Pick<SequenceAdminOptions, 'guard' | 'imports'>,
    optionsProviders: Provider[],
  ): DynamicModule {
    return {
      module: SequenceAdminModule,
      imports: [...(options.imports ?? [])],
      controllers: [
        ...API_CONTROLLERS.map((controller) => mounted(controller, `${path}/api`)),
        // The web page at `<path>/`, after the API so that its `:file` route never shadows it.
        mounted(ConsolePageController, path),
      ],
      providers: [...optionsProviders, ...guardProviders(options.guard), ...READERS],
    };
  }
}
