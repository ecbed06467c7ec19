import { Inject, Injectable } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import type { SequenceStore } from '../ports/sequence-store.port';
import type { Transport } from '../ports/transport.port';
import { SEQUENCE_STORE, SEQUENCE_TRANSPORT } from '../kernel/tokens';
import { errorMessage } from '../core/errors/caught';

/** What the indicator reports of the transport or the store. */
export type SequenceDependencyHealth = {
  /** The adapter's `name` (`rabbitmq`, `redis`, `in-memory`, `memory`). */
  readonly name: string;
  readonly status: 'up' | 'down';
  /** Why it is down: the ping's error, or that it did not answer in time. */
  readonly message?: string;
};

// Type aliases, not interfaces: terminus takes the details as a `Record<string, unknown>`.
export type SequenceHealthDetails = {
  readonly transport: SequenceDependencyHealth;
  readonly store: SequenceDependencyHealth;
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
    const details: SequenceHealthDetails = { transport, store };
    const indicator = this.health.check(key);
    return transport.status === 'up' && store.status === 'up'
      ? indicator.up(details)
      : indicator.down(details);
  }
}

/** Pings `dependency` within `timeoutMs`: up, or down with why. */
export async function probe(
  dependency: { readonly name: string; ping(): Promise<void> },
  timeoutMs: number,
): Promise<SequenceDependencyHealth> {
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new Error(`no answer to ping within ${timeoutMs} ms`)),
      timeoutMs,
    );
  });
  try {
    await Promise.race([dependency.ping(), timedOut]);
    return { name: dependency.name, status: 'up' };
  } catch (error) {
    return { name: dependency.name, status: 'down', message: errorMessage(error) };
  } finally {
    clearTimeout(timer);
  }
}
