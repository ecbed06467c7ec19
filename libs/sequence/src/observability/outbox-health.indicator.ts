import { Injectable } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import { withTimeout } from '../core/async';
import { OutboxRuntime } from '../outbox/outbox.runtime';
import { BOX_NAMES, type BoxName } from '../ports/outbox-store.port';
import {
  probe,
  type SequenceDependencyHealth,
  type SequenceHealthCheckOptions,
} from './sequence-health.indicator';

// A type alias, not an interface: terminus takes the details as a `Record<string, unknown>`.
export type OutboxHealthDetails = {
  readonly store: SequenceDependencyHealth;
  /**
   * `FAILED` records per box (they wait for an operator; they do not make the check fail).
   * Left out when counting failed or took longer than the timeout.
   */
  readonly failed?: Readonly<Partial<Record<BoxName, number>>>;
};

const DEFAULT_TIMEOUT_MS = 1_000;

/**
 * `@nestjs/terminus` health indicator of the Outbox / Inbox: pings its database within a timeout
 * (opening it first, if the outbox has not started yet), and lists the `FAILED` records per box.
 * While the database is down nothing is lost: commits fail for their callers, relays wait, and
 * inbox messages are requeued.
 *
 * @example
 * ```ts
 * check() {
 *   return this.health.check([() => this.outbox.isHealthy('outbox')]);
 * }
 * // { "outbox": { "status": "up", "store": { "name": "postgres", "status": "up" }, "failed": { ... } } }
 * ```
 */
@Injectable()
export class OutboxHealthIndicator {
  constructor(
    private readonly health: HealthIndicatorService,
    private readonly runtime: OutboxRuntime,
  ) {}

  async isHealthy<const Key extends string>(
    key: Key,
    options: SequenceHealthCheckOptions = {},
  ): Promise<HealthIndicatorResult<Key, 'up' | 'down', OutboxHealthDetails>> {
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const indicator = this.health.check(key);
    const opened = this.runtime.ready();
    const store = await probe(
      { name: 'outbox store', ping: async () => (await opened).ping() },
      timeoutMs,
    );
    if (store.status === 'down') return indicator.down({ store });
    const ready = await opened;
    // The counts are details: counting slowly (a large table) or failing must neither hold the
    // probe past its timeout nor turn a database that answered into a failed check.
    const failed = await withTimeout(
      Promise.all(BOX_NAMES.map(async (box) => [box, (await ready.stats(box)).failed] as const)),
      timeoutMs,
      () => new Error(`the FAILED counts took over ${timeoutMs} ms`),
    ).then(
      (counts): Partial<Record<BoxName, number>> => Object.fromEntries(counts),
      () => undefined,
    );
    return indicator.up({ store: { ...store, name: ready.name }, ...(failed && { failed }) });
  }
}
