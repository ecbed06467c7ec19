/**
 * Commit-to-publish latency at a steady rate: one commit per event, started on a fixed schedule
 * (`rate` per second), its commit time noted right after the commit resolved; a consumer of the
 * output queue in this process notes when each message arrived. Latency = arrival − commit.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import type * as amqp from 'amqplib';
import { recordArrivals, waitForArrivals } from './outbox.broker';
import { round1 } from './harness/report';
import { nowMs, percentile, sleep } from './outbox.settings';
import type { ClaimTimes } from './outbox.traced-store';

export interface LatencyOptions {
  readonly connection: amqp.ChannelModel;
  readonly queue: string;
  readonly count: number;
  readonly rate: number;
  /** Commits event `i` (its own transaction); resolves after COMMIT. */
  commit(i: number): Promise<void>;
  /** The message id of event `i`. */
  idOf(i: number): string;
  /** The message id a delivered message carries. */
  messageIdOf(message: amqp.ConsumeMessage): string | undefined;
  /** When the relay's claim of message `id` started and locked its batch, where it is known. */
  claimTimesOf?(id: string): ClaimTimes | undefined;
}

/**
 * Where the slowest 1% of messages (latency at or above the p99) spent their time, as medians
 * over them (ms): from the commit to the start of the claim that took it (the wake-up: the
 * announcement, and waiting for a claim to start), the claim's lock, and from the lock to the
 * arrival (publish, broker, consumer).
 */
export interface SlowestBreakdown {
  readonly messages: number;
  readonly commitToClaimMs: number;
  readonly lockMs: number;
  readonly lockedToArrivalMs: number;
}

export interface LatencyResult {
  readonly events: number;
  readonly offeredPerSecond: number;
  /** Commits per second achieved (first start to last commit). */
  readonly committedPerSecond: number;
  readonly p50Ms: number;
  readonly p90Ms: number;
  readonly p99Ms: number;
  readonly maxMs: number;
  /** Messages that arrived before their commit's promise resolved here (the clock's resolution). */
  readonly arrivedBeforeCommitResolved: number;
  readonly duplicates: number;
  /**
   * How late this process's event loop ran its callbacks while commits and arrivals were noted
   * (p99 and max, ms): writers, relay and consumer share it, so a stall here (a garbage
   * collection, a busy core) delays arrivals, and shows in the latencies, whatever the outbox did.
   */
  readonly eventLoopDelayP99Ms: number;
  readonly eventLoopDelayMaxMs: number;
  readonly slowest?: SlowestBreakdown;
}

export async function steadyLatency(options: LatencyOptions): Promise<LatencyResult> {
  const { count, rate } = options;
  const recorder = await recordArrivals(options.connection, options.queue, options.messageIdOf);
  const committedAt = new Map<string, number>();
  const pending: Promise<void>[] = [];
  let failure: Error | undefined;
  const interval = 1000 / rate;
  const loopDelay = monitorEventLoopDelay({ resolution: 1 });
  loopDelay.enable();
  const started = nowMs();
  try {
    let next = 0;
    while (next < count) {
      const now = nowMs();
      while (next < count && started + next * interval <= now) {
        const i = next++;
        pending.push(
          options.commit(i).then(
            () => void committedAt.set(options.idOf(i), nowMs()),
            (error: unknown) =>
              void (failure ??= error instanceof Error ? error : new Error(String(error))),
          ),
        );
      }
      if (next < count) await sleep(Math.max(0, started + next * interval - nowMs()));
    }
    await Promise.all(pending);
    if (failure) throw failure;
    const lastCommit = Math.max(...committedAt.values());
    await waitForArrivals(recorder, count);
    loopDelay.disable();

    const latencies: number[] = [];
    const byLatency: { id: string; ms: number }[] = [];
    for (let i = 0; i < count; i++) {
      const id = options.idOf(i);
      const ms = (recorder.arrivals.get(id) as number) - (committedAt.get(id) as number);
      latencies.push(ms);
      byLatency.push({ id, ms });
    }
    latencies.sort((a, b) => a - b);
    const p99 = percentile(latencies, 99);
    const slowest = options.claimTimesOf
      ? breakdown(
          byLatency.filter(({ ms }) => ms >= p99).map(({ id }) => id),
          (id) => options.claimTimesOf?.(id),
          committedAt,
          recorder.arrivals,
        )
      : undefined;
    return {
      events: count,
      offeredPerSecond: rate,
      committedPerSecond: Math.round(count / ((lastCommit - started) / 1000)),
      p50Ms: round1(percentile(latencies, 50)),
      p90Ms: round1(percentile(latencies, 90)),
      p99Ms: round1(p99),
      maxMs: round1(latencies[latencies.length - 1]),
      arrivedBeforeCommitResolved: latencies.filter((ms) => ms < 0).length,
      duplicates: recorder.duplicates,
      eventLoopDelayP99Ms: round1(loopDelay.percentile(99) / 1e6),
      eventLoopDelayMaxMs: round1(loopDelay.max / 1e6),
      ...(slowest ? { slowest } : {}),
    };
  } finally {
    loopDelay.disable();
    await recorder.close();
  }
}

function breakdown(
  ids: readonly string[],
  claimTimesOf: (id: string) => ClaimTimes | undefined,
  committedAt: ReadonlyMap<string, number>,
  arrivals: ReadonlyMap<string, number>,
): SlowestBreakdown | undefined {
  const toClaim: number[] = [];
  const lock: number[] = [];
  const toArrival: number[] = [];
  for (const id of ids) {
    const times = claimTimesOf(id);
    if (!times) continue;
    toClaim.push(times.startedAt - (committedAt.get(id) as number));
    lock.push(times.lockedAt - times.startedAt);
    toArrival.push((arrivals.get(id) as number) - times.lockedAt);
  }
  if (toClaim.length === 0) return undefined;
  const median = (values: number[]) =>
    round1(
      percentile(
        [...values].sort((a, b) => a - b),
        50,
      ),
    );
  return {
    messages: toClaim.length,
    commitToClaimMs: median(toClaim),
    lockMs: median(lock),
    lockedToArrivalMs: median(toArrival),
  };
}
