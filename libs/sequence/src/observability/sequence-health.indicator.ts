import { Inject, Injectable, Optional } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import type { SequenceStore } from '../ports/sequence-store.port';
import type { Transport } from '../ports/transport.port';
import {
  SEQUENCE_BUDGETS,
  SEQUENCE_STORE,
  SEQUENCE_TRANSPORT,
  SWEEP_TIMING,
  type SequenceBudgets,
  type SweepTiming,
} from '../kernel/tokens';
import { errorMessage } from '../core/errors/caught';
import { oneAtATime, withTimeout } from '../core/async';
import {
  HEALTH_OPTIONS,
  resolveHealthOptions,
  type ResolvedHealthOptions,
  resolveHealthCheck,
} from './health.options';
import { formatMs, HealthVerdict, RUNBOOKS, type HealthFindings } from './health-verdict';

/** What the indicator reports of the transport or the store. */
export type SequenceDependencyHealth = {
  /** The adapter's `name` (`rabbitmq`, `redis`, `in-memory`, `memory`). */
  readonly name: string;
  readonly status: 'up' | 'down';
  /** Why it is down: the ping's error, or that it did not answer in time. */
  readonly message?: string;
};

/** How full the sequence store's budget is (`stats()` against `sequence.maxBufferedBytes`). */
export type SequenceBufferHealth = {
  readonly openSequences: number;
  /** Budget held by stored fragments: bodies, kept headers, per-sequence/fragment overheads. */
  readonly bufferedBytes: number;
  /** Budget held ahead of stored bytes: reservations for declared bytes, grants in flight. */
  readonly reservedBytes: number;
  readonly maxBufferedBytes: number;
  /** `bufferedBytes / maxBufferedBytes`, in percent (one decimal). */
  readonly storedPercent: number;
  /** `reservedBytes / maxBufferedBytes`, in percent (one decimal). */
  readonly reservedPercent: number;
  /**
   * `(bufferedBytes + reservedBytes) / maxBufferedBytes`, in percent (one decimal): what
   * `sequence.bufferPercent` is judged on.
   */
  readonly usedPercent: number;
  /** Age of the oldest open sequence (from its first fragment), in ms; absent when none is open. */
  readonly oldestOpenAgeMs?: number;
};

// Type aliases, not interfaces: terminus takes the details as a `Record<string, unknown>`.
export type SequenceHealthDetails = {
  readonly transport: SequenceDependencyHealth;
  readonly store: SequenceDependencyHealth;
  /** The store's budget, when the store is up and its stats answered within the timeout. */
  readonly buffer?: SequenceBufferHealth;
} & HealthFindings;

export interface SequenceHealthCheckOptions {
  /** How long each ping may take before it counts as down. @default 1000 */
  readonly timeoutMs?: number;
  /**
   * `false`: report the figures but judge no threshold, so that only a dependency that does not
   * answer makes the indicator down (a readiness probe; see docs/health.md).
   * @default true
   */
  readonly thresholds?: boolean;
}

/**
 * `@nestjs/terminus` health indicator of Message Sequence: pings the transport and the sequence
 * store at once, each within a timeout, and reports the store's budget (stored and reserved bytes
 * against `sequence.maxBufferedBytes`) and the age of the oldest open sequence. Down when the
 * transport or the store does not answer, or when a threshold of `SequenceHealthModule.forRoot`
 * is passed (by default the budget 80% used, or a sequence open past its timeout): `tripped`
 * names each with its value and limit; `warnings` lists values close to theirs.
 *
 * Needs `TerminusModule` and the `SequenceModule`'s providers in scope: import
 * `SequenceHealthModule` (with `SequenceModule` registered `isGlobal`), or add this class to the
 * providers of a module that imports both.
 *
 * @example
 * ```ts
 * @Get('health')
 * @HealthCheck()
 * check() {
 *   return this.health.check([() => this.sequence.isHealthy('sequence')]);
 * }
 * // { "sequence": { "status": "up", "transport": { "name": "rabbitmq", "status": "up" },
 * //                 "store": { "name": "redis", "status": "up" }, "buffer": { ... } } }
 * ```
 */
@Injectable()
export class SequenceHealthIndicator {
  /** The store's stats, shared with a read still running from an earlier probe. */
  private readonly readStats = sharedHealthCall(() => this.store.stats(Date.now()));

  private readonly thresholds: ResolvedHealthOptions;

  constructor(
    private readonly health: HealthIndicatorService,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(SEQUENCE_STORE) private readonly store: SequenceStore,
    @Inject(SEQUENCE_BUDGETS) private readonly budgets: SequenceBudgets,
    @Inject(SWEEP_TIMING) private readonly timing: SweepTiming,
    @Optional() @Inject(HEALTH_OPTIONS) thresholds?: ResolvedHealthOptions,
  ) {
    this.thresholds = thresholds ?? resolveHealthOptions();
  }

  async isHealthy<const Key extends string>(
    key: Key,
    options: SequenceHealthCheckOptions = {},
  ): Promise<HealthIndicatorResult<Key, 'up' | 'down', SequenceHealthDetails>> {
    const { timeoutMs, thresholds } = resolveHealthCheck(
      'SequenceHealthIndicator.isHealthy',
      options,
    );
    const [transport, store] = await Promise.all([
      probe(this.transport, timeoutMs),
      probe(this.store, timeoutMs),
    ]);
    const buffer = store.status === 'up' ? await this.buffer(timeoutMs) : undefined;
    const verdict = new HealthVerdict(this.thresholds.warnRatio);
    if (buffer && thresholds) this.judge(buffer, verdict);
    const details: SequenceHealthDetails = {
      transport,
      store,
      ...(buffer && { buffer }),
      ...verdict.findings(),
    };
    const indicator = this.health.check(key);
    return transport.status === 'up' && store.status === 'up' && !verdict.down
      ? indicator.up(details)
      : indicator.down(details);
  }

  private judge(buffer: SequenceBufferHealth, verdict: HealthVerdict): void {
    const { bufferPercent, oldestOpenAgeMs } = this.thresholds.sequence;
    verdict.judge({
      threshold: 'sequence.bufferPercent',
      value: buffer.usedPercent,
      limit: bufferPercent,
      downAtLimit: true,
      runbook: RUNBOOKS.bufferFull,
      describe: (value, limit) =>
        `sequence buffer ${value}% used (stored and reserved of ${buffer.maxBufferedBytes} ` +
        `bytes), limit ${limit}%`,
    });
    if (buffer.oldestOpenAgeMs === undefined) return;
    const { sequenceTimeout, expirySweepMs } = this.timing;
    verdict.judge({
      threshold: 'sequence.oldestOpenAgeMs',
      value: buffer.oldestOpenAgeMs,
      limit:
        oldestOpenAgeMs === 'timeout'
          ? sequenceTimeout.ms + (expirySweepMs === false ? 0 : expirySweepMs)
          : oldestOpenAgeMs,
      runbook: RUNBOOKS.sequenceTooOld,
      describe: (value, limit) =>
        `oldest open sequence ${formatMs(value)} old, limit ${formatMs(limit)}` +
        (oldestOpenAgeMs === 'timeout' ? ' (sequence.timeoutMs and one expiry sweep)' : ''),
    });
  }

  private async buffer(timeoutMs: number): Promise<SequenceBufferHealth | undefined> {
    // A store whose stats() throws before it returns a promise leaves the buffer out, as a
    // rejection does, rather than failing the whole check (oneAtATime calls it in an async
    // function).
    const stats = await withinTimeout(this.readStats(), timeoutMs).catch(() => undefined);
    const now = Date.now();
    if (!stats) return undefined;
    const { maxBufferedBytes } = this.budgets;
    const reservedBytes = stats.reservedBytes ?? 0;
    const percentOf = (bytes: number) => Math.round((bytes / maxBufferedBytes) * 1000) / 10;
    return {
      openSequences: stats.openSequences,
      bufferedBytes: stats.bufferedBytes,
      reservedBytes,
      maxBufferedBytes,
      storedPercent: percentOf(stats.bufferedBytes),
      reservedPercent: percentOf(reservedBytes),
      usedPercent: percentOf(stats.bufferedBytes + reservedBytes),
      // Another instance's clock wrote oldestOpenAt: a little ahead of this one's, it is 0.
      ...(stats.oldestOpenAt !== undefined && {
        oldestOpenAgeMs: Math.max(0, now - stats.oldestOpenAt),
      }),
    };
  }
}

async function withinTimeout<T>(promise: Promise<T>, timeoutMs: number, what = ''): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    const answer = what ? `no answer ${what}` : 'no answer';
    timer = setTimeout(() => reject(new Error(`${answer} within ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    return await Promise.race([promise, timedOut]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * How long later probes wait on a call an earlier one gave up on, at most. A call the timeout gave
 * up on keeps running (a pool connection, a lock queued for): the next probes wait on it rather
 * than start more of them, but not for ever: one that hangs (a half-open connection) would keep
 * every later probe down while the other connections work.
 */
export const HEALTH_CALL_SHARED_MS = 30_000;

/**
 * `call`, shared by the probes that come while it runs, for at most
 * {@link HEALTH_CALL_SHARED_MS}: the next probe after that starts a call of its own.
 */
export function sharedHealthCall<T>(call: () => Promise<T>): () => Promise<T> {
  return oneAtATime(() =>
    withTimeout(
      call(),
      HEALTH_CALL_SHARED_MS,
      () => new Error(`no answer within ${HEALTH_CALL_SHARED_MS} ms`),
    ),
  );
}

/** Each dependency's ping in flight (see {@link sharedHealthCall}). */
const pings = new WeakMap<object, () => Promise<void>>();

/** `dependency`'s ping, shared with any still running from an earlier probe. */
export function sharedPing(dependency: { ping(): Promise<void> }): Promise<void> {
  let ping = pings.get(dependency);
  if (!ping) {
    ping = sharedHealthCall(() => dependency.ping());
    pings.set(dependency, ping);
  }
  return ping();
}

/** Pings `dependency` within `timeoutMs` (see {@link sharedPing}): up, or down with why. */
export async function probe(
  dependency: { readonly name: string; ping(): Promise<void> },
  timeoutMs: number,
): Promise<SequenceDependencyHealth> {
  try {
    await withinTimeout(sharedPing(dependency), timeoutMs, 'to ping');
    return { name: dependency.name, status: 'up' };
  } catch (error) {
    return { name: dependency.name, status: 'down', message: errorMessage(error) };
  }
}
