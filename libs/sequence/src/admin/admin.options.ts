import type { CanActivate, ModuleMetadata, Type } from '@nestjs/common';
import { SequenceOptionsError } from '../core/errors/sequence-options.error';
import { checkKeys, SEQUENCE_ADMIN_KEYS } from '../options/option-keys';

/** Options of `SequenceAdminModule.forRoot`. */
export interface SequenceAdminOptions {
  /**
   * Where the console is mounted: the page at `/<path>/`, the JSON API under `/<path>/api/`
   * (after the application's global prefix, if any).
   * @default 'sequence-admin'
   */
  readonly path?: string;
  /**
   * Who may use the console: a guard class (provided in the admin module; its dependencies come
   * from `imports` or global modules) or instance. It sees the request as any Nest guard does;
   * what it puts on `request.user` names the actor of recorded actions.
   * @default none: only clients connecting from loopback (127.0.0.0/8, ::1) are served
   */
  readonly guard?: Type<CanActivate> | CanActivate;
  /** Modules the guard class's dependencies come from. @default [] */
  readonly imports?: ModuleMetadata['imports'];
  /**
   * Whether the actions that change something (replay, discard, retry, skip, release) are
   * allowed. Off, they answer 403 `mutations-disabled`.
   * @default false
   */
  readonly mutations?: boolean;
  /**
   * Dead letters replayed per second, at most, by one replay request.
   * @default 20
   */
  readonly replayRatePerSecond?: number;
  /**
   * Most items one request lists or acts on (a replay or discard `all`, or by reason, takes the
   * first this many: repeat it for more). At most 1000.
   * @default 500
   */
  readonly maxBatch?: number;
  /**
   * Dead-letter sources beyond the channels this application consumes: more channels whose dead
   * letters the console browses.
   * @default []
   */
  readonly deadLetterChannels?: readonly string[];
}

/** The options with their defaults, as the admin module's parts read them. */
export interface ResolvedAdminOptions {
  readonly path: string;
  readonly mutations: boolean;
  readonly replayRatePerSecond: number;
  readonly maxBatch: number;
  readonly deadLetterChannels: readonly string[];
  readonly guard?: Type<CanActivate> | CanActivate;
}

const PATH = /^[A-Za-z0-9._~-]+(\/[A-Za-z0-9._~-]+)*$/;

/** @throws SequenceOptionsError listing every option to fix */
export function resolveAdminOptions(given: SequenceAdminOptions = {}): ResolvedAdminOptions {
  const problems: string[] = [];
  checkKeys(problems, given, SEQUENCE_ADMIN_KEYS);
  const path = (given.path ?? 'sequence-admin').replace(/^\/+|\/+$/g, '');
  if (!PATH.test(path)) {
    problems.push(
      `path ${JSON.stringify(given.path)} must be one or more URL path segments of ` +
        'letters, digits and . _ ~ - (e.g. "sequence-admin" or "ops/sequence")',
    );
  }
  const replayRatePerSecond = given.replayRatePerSecond ?? 20;
  if (!(replayRatePerSecond > 0 && Number.isFinite(replayRatePerSecond))) {
    problems.push(`replayRatePerSecond must be a number > 0, got ${String(replayRatePerSecond)}`);
  }
  const maxBatch = given.maxBatch ?? 500;
  if (!(Number.isSafeInteger(maxBatch) && maxBatch >= 1 && maxBatch <= 1_000)) {
    problems.push(`maxBatch must be an integer from 1 to 1000, got ${String(maxBatch)}`);
  }
  if (given.mutations !== undefined && typeof given.mutations !== 'boolean') {
    problems.push(`mutations must be true or false, got ${JSON.stringify(given.mutations)}`);
  }
  const deadLetterChannels: unknown = given.deadLetterChannels ?? [];
  if (
    !Array.isArray(deadLetterChannels) ||
    !deadLetterChannels.every((channel) => typeof channel === 'string' && channel.length > 0)
  ) {
    problems.push('deadLetterChannels must be an array of channel names (non-empty strings)');
  }
  const guard = given.guard;
  if (
    guard !== undefined &&
    typeof guard !== 'function' &&
    typeof guard.canActivate !== 'function'
  ) {
    problems.push('guard must be a CanActivate class or an object with a canActivate method');
  }
  if (problems.length > 0) throw new SequenceOptionsError('SequenceAdminModule options', problems);
  return {
    path,
    mutations: given.mutations === true,
    replayRatePerSecond,
    maxBatch,
    deadLetterChannels: [...(deadLetterChannels as readonly string[])],
    guard,
  };
}

/** Injection token of the {@link ResolvedAdminOptions}. */
export const ADMIN_OPTIONS = Symbol('nest-sequence:admin-options');
/** Injection token of the app's guard instance (undefined: loopback only). */
export const ADMIN_GUARD = Symbol('nest-sequence:admin-guard');
