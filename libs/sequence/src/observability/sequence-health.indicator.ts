import { Inject, Injectable } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import type { SequenceStore } from '../ports/sequence-store.port';
import type { Transport } from '../ports/transport.port';
import {
  SEQUENCE_BUDGETS,
  SEQUENCE_STORE,
  SEQUENCE_TRANSPORT,
  type SequenceBudgets,
} from '../kernel/tokens';
import { errorMessage } from '../core/errors/caught';

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
  /** `(bufferedBytes + reservedBytes) / maxBufferedBytes`, in percent (one decimal). */
  readonly usedPercent: number;
};

// Type aliases, not interfaces: terminus takes the details as a `Record<string, unknown>`.
export type SequenceHealthDetails = {
  readonly transport: SequenceDependencyHealth;
  readonly store: SequenceDependencyHealth;
  /** The store's budget, when the store is up and its stats answered within the timeout. */
  readonly buffer?: SequenceBufferHealth;
};

export interface SequenceHealthCheckOptions {
  /** How long each ping may take before it counts as down. @default 1000 */
  readonly timeoutMs?: number;
}

const DEFAULT_TIMEOUT_MS = 1_000;

/**
 * `@nestjs/terminus` health indicator of Message Sequence: pings the transport and the sequence
 * store at once, each within a timeout, and is up only when both answer. The result names each
 * adapter and, for one that is down, why.
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
 * //                 "store": { "name": "redis", "status": "up" } } }
 * ```
 */
@Injectable()
export class SequenceHealthIndicator {
  constructor(
    private readonly health: HealthIndicatorService,
    @Inject(SEQUENCE_TRANSPORT) private readonly transport: Transport,
    @Inject(SEQUENCE_STORE) private readonly store: SequenceStore,
    @Inject(SEQUENCE_BUDGETS) private readonly budgets: SequenceBudgets,
  ) {}

  async isHealthy<const Key extends string>(
    key: Key,
    options: SequenceHealthCheckOptions = {},
  ): Promise<HealthIndicatorResult<Key, 'up' | 'down', SequenceHealthDetails>> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const [transport, store] = await Promise.all([
      probe(this.transport, timeoutMs),
      probe(this.store, timeoutMs),
    ]);
    const buffer = store.status === 'up' ? await this.buffer(timeoutMs) : undefined;
    const details: SequenceHealthDetails = buffer
      ? { transport, store, buffer }
      : { transport, store };
    const indicator = this.health.check(key);
    return transport.status === 'up' && store.status === 'up'
      ? indicator.up(details)
      : indicator.down(details);
  }

  private async buffer(timeoutMs: number): Promise<SequenceBufferHealth | undefined> {
    const stats = await withinTimeout(this.store.stats(Date.now()), timeoutMs).catch(
      () => undefined,
    );
    if (!stats) return undefined;
    const { maxBufferedBytes } = this.budgets;
    const reservedBytes = stats.reservedBytes ?? 0;
    const used = ((stats.bufferedBytes + reservedBytes) / maxBufferedBytes) * 100;
    return {
      openSequences: stats.openSequences,
      bufferedBytes: stats.bufferedBytes,
      reservedBytes,
      maxBufferedBytes,
      usedPercent: Math.round(used * 10) / 10,
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

/** Pings `dependency` within `timeoutMs`: up, or down with why. */
export async function probe(
  dependency: { readonly name: string; ping(): Promise<void> },
  timeoutMs: number,
): Promise<SequenceDependencyHealth> {
  try {
    await withinTimeout(dependency.ping(), timeoutMs, 'to ping');
    return { name: dependency.name, status: 'up' };
  } catch (error) {
    return { name: dependency.name, status: 'down', message: errorMessage(error) };
  }
}
