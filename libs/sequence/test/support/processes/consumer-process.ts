import { join, resolve } from 'node:path';
import type { TransportCase } from '../transports.fixture';
import { FixtureProcess } from './fixture-process';

const SCRIPT = resolve(__dirname, 'fixtures/consumer.process.ts');

/** A line of the consumer process's results file (see fixtures/consumer.process.ts). */
export interface ConsumerEvent {
  readonly event: 'ready' | 'accepted' | 'started' | 'delivered';
  readonly pid: number;
  /** Epoch milliseconds. */
  readonly at: number;
  readonly sequenceId?: string;
  readonly bytes?: number;
  readonly sha256?: string;
  readonly fragments?: number;
  /** Of an `accepted` fragment. */
  readonly position?: number;
}

export interface ConsumerProcessSettings {
  /** The broker it consumes from. */
  readonly on: TransportCase;
  readonly redisUrl: string;
  readonly channel: string;
  readonly prefix: string;
  /** Where the results file and the delivered payloads go (one directory per test). */
  readonly dir: string;
  readonly leaseMs?: number;
  readonly handlerSleepMs?: number;
  /** How far ahead of the machine's the process's clock runs (`Date.now`); negative: behind. */
  readonly clockSkewMs?: number;
  /** `sequence.buffer` (store unless given) and, broker-held, `sequence.partitions`. */
  readonly buffer?: 'store' | 'broker';
  readonly partitions?: number;
}

/** fixtures/consumer.process.ts running in a child process. */
export class ConsumerProcess extends FixtureProcess<ConsumerEvent> {
  /** Starts one and resolves once it consumes (its "ready" line). */
  static async start(settings: ConsumerProcessSettings): Promise<ConsumerProcess> {
    return ConsumerProcess.spawn(settings, false).ready();
  }

  /**
   * Spawns one held: it loads its code (the second or two a process takes to start) but neither
   * connects nor consumes until {@link ConsumerProcess.go}, so that a test can have a process
   * start consuming within moments, as a restart that was already under way would.
   */
  static held(settings: ConsumerProcessSettings): ConsumerProcess {
    return ConsumerProcess.spawn(settings, true);
  }

  /** Lets a process spawned {@link ConsumerProcess.held} connect; resolves once it consumes. */
  go(): Promise<this> {
    return this.release();
  }

  private static spawn(settings: ConsumerProcessSettings, held: boolean): ConsumerProcess {
    const resultsFile = join(settings.dir, 'results.jsonl');
    const env = {
      ...settings.on.processEnv,
      REDIS_URL: settings.redisUrl,
      CHANNEL: settings.channel,
      PREFIX: settings.prefix,
      RESULTS_FILE: resultsFile,
      PAYLOAD_DIR: settings.dir,
      LEASE_MS: String(settings.leaseMs ?? 30_000),
      HANDLER_SLEEP_MS: String(settings.handlerSleepMs ?? 0),
      CLOCK_SKEW_MS: String(settings.clockSkewMs ?? 0),
      BUFFER: settings.buffer ?? 'store',
      PARTITIONS: String(settings.partitions ?? 4),
      HELD: held ? '1' : undefined,
    };
    const child = FixtureProcess.spawnFixture(SCRIPT, env, held ? 'pipe' : 'ignore');
    return new ConsumerProcess(child, resultsFile);
  }
}

/**
 * Starts a test file's consumer processes: each on `base()` (read as it starts, so a test's own
 * channel and directory), with `settings` on top, recorded in `started` for the file's cleanup.
 */
export function consumerLauncher(base: () => ConsumerProcessSettings, started: ConsumerProcess[]) {
  return {
    /** Starts one and resolves once it consumes. */
    async start(settings: Partial<ConsumerProcessSettings> = {}): Promise<ConsumerProcess> {
      const consumer = await ConsumerProcess.start({ ...base(), ...settings });
      started.push(consumer);
      return consumer;
    },
    /** Spawns one held: its code loads now, it connects and consumes on `go()`. */
    held(settings: Partial<ConsumerProcessSettings> = {}): ConsumerProcess {
      const consumer = ConsumerProcess.held({ ...base(), ...settings });
      started.push(consumer);
      return consumer;
    },
  };
}
