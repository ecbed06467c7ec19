import { join, resolve } from 'node:path';
import { FixtureProcess } from './fixture-process';

const SCRIPT = resolve(__dirname, 'fixtures/outbox-relay.process.ts');

/** ts-node compiles the library at each start: slow when several processes start at once. */
const STARTUP_TIMEOUT_MS = 40_000;

/** A line of the results file (see fixtures/outbox-relay.process.ts). */
export interface OutboxRelayEvent {
  readonly event: 'loaded' | 'ready' | 'committed' | 'blocked' | 'published';
  readonly pid: number;
  /** Epoch milliseconds. */
  readonly at: number;
  /** `committed`: the ids of the events committed at start. */
  readonly ids?: readonly string[];
  /** `blocked`, `published`: the record's message id, and the channel. */
  readonly id?: string;
  readonly channel?: string;
}

/** Where the relay's transport stops (see the fixture). */
export type RelayMode = 'on' | 'block-before-publish' | 'hang-after-publish';

export interface OutboxRelaySettings {
  readonly databaseUrl: string;
  readonly amqpUrl: string;
  readonly tablePrefix: string;
  /** Every event goes to each of these, in this order. */
  readonly channels: readonly string[];
  /** Where the results file goes (one directory per test, shared by its processes). */
  readonly dir: string;
  /** @default 'on' */
  readonly relay?: RelayMode;
  /** Events committed, in one transaction, once the relay runs. @default 0 */
  readonly commit?: number;
  /** Their ids are `<idPrefix>-<i>`. @default `p<pid>` */
  readonly idPrefix?: string;
  readonly batchSize?: number;
  readonly pollIntervalMs?: number;
}

/** fixtures/outbox-relay.process.ts running in a child process. */
export class OutboxRelayProcess extends FixtureProcess<OutboxRelayEvent> {
  /** Starts one and resolves once its relay runs (its "ready" line). */
  static async start(settings: OutboxRelaySettings): Promise<OutboxRelayProcess> {
    const relay = OutboxRelayProcess.spawn(settings, false);
    return relay.orKilled(relay.ready());
  }

  /**
   * Starts one that loads its code and then waits: {@link go} starts its outbox. For a restart
   * after a kill that takes as long as an application's start, not as long as ts-node's.
   */
  static async standby(settings: OutboxRelaySettings): Promise<OutboxRelayProcess> {
    const relay = OutboxRelayProcess.spawn(settings, true);
    const loaded = relay.waitFor(
      (events) => events.some((e) => e.event === 'loaded' && e.pid === relay.pid),
      `outbox relay process ${relay.pid} to load`,
      STARTUP_TIMEOUT_MS,
    );
    await relay.orKilled(loaded);
    return relay;
  }

  /** Starts the outbox of a process in standby; resolves once its relay runs. */
  async go(): Promise<this> {
    this.child.kill('SIGUSR2');
    return this.orKilled(this.ready());
  }

  /**
   * `waiting`, or, when it fails (the process did not start in time), the process killed first:
   * the caller never got hold of it, so nobody else would.
   */
  private async orKilled<T>(waiting: Promise<T>): Promise<T> {
    try {
      return await waiting;
    } catch (error) {
      await this.kill();
      throw error;
    }
  }

  private static spawn(settings: OutboxRelaySettings, standby: boolean): OutboxRelayProcess {
    const resultsFile = join(settings.dir, 'results.jsonl');
    const optional = (value: number | string | undefined) =>
      value === undefined ? undefined : String(value);
    const child = FixtureProcess.spawnFixture(SCRIPT, {
      DATABASE_URL: settings.databaseUrl,
      AMQP_URL: settings.amqpUrl,
      TABLE_PREFIX: settings.tablePrefix,
      CHANNELS: settings.channels.join(','),
      RESULTS_FILE: resultsFile,
      RELAY: settings.relay,
      COMMIT: optional(settings.commit),
      ID_PREFIX: settings.idPrefix,
      BATCH_SIZE: optional(settings.batchSize),
      POLL_INTERVAL_MS: optional(settings.pollIntervalMs),
      STANDBY: standby ? '1' : undefined,
    });
    return new OutboxRelayProcess(child, resultsFile);
  }

  /**
   * Resolves once this process wrote its "ready" line. Longer than the default wait: start-up
   * (ts-node compiling the library) is slow when several processes start at once.
   */
  protected override async ready(): Promise<this> {
    await this.waitFor(
      (events) => events.some((e) => e.event === 'ready' && e.pid === this.pid),
      `outbox relay process ${this.pid} to be ready`,
      STARTUP_TIMEOUT_MS,
    );
    return this;
  }

  /** This process's own lines. */
  ownEvents(): OutboxRelayEvent[] {
    return this.events().filter((e) => e.pid === this.pid);
  }

  /** Resolves with the ids this process committed at start, once it reported them. */
  async committed(): Promise<readonly string[]> {
    await this.waitFor(
      () => this.ownEvents().some((e) => e.event === 'committed'),
      `process ${this.pid} to commit its events`,
    );
    return this.ownEvents().find((e) => e.event === 'committed')!.ids!;
  }

  /** Resolves once this process reported `event` for each of `ids` on `channel`. */
  async reported(
    event: 'blocked' | 'published',
    ids: readonly string[],
    channel: string,
  ): Promise<void> {
    await this.waitFor(() => {
      const seen = new Set(
        this.ownEvents().flatMap((e) => (e.event === event && e.channel === channel ? [e.id] : [])),
      );
      return ids.every((id) => seen.has(id));
    }, `process ${this.pid} to report ${event} on ${channel} for ${ids.length} records`);
  }
}
