/**
 * The result lines of bench:sequence (RabbitMQ or NATS): a 180 MiB case (medians over its measured rounds of
 * a and b, peaks of the consumers' RSS, where b's time went) and the 500 MiB case (b only).
 */
import { mbPerSecond, median, medianOf, MiB, round1, round2 } from './harness/report';
import type { ModuleTrace } from './sequence-rabbitmq.protocol';
import type { RunFigures } from './sequence-rabbitmq.runs';

/** The module's rate against the raw baseline's, at least: per broker. */
export const RATIO_TARGETS = { rabbitmq: 0.35, nats: 0.5 } as const;
/** The ratio broker-held reassembly is to reach, on either broker. */
export const BROKER_HELD_RATIO_TARGET = 0.7;
/** The 500 MiB case's consumer peak RSS target with broker-held reassembly. */
export const BROKER_HELD_RSS_TARGET_MIB = 120;
const BIG_RSS_TARGET_MIB = 200;

/** The settings a result line echoes. */
export interface LineSettings {
  readonly unsafeSocketTricks: boolean;
  readonly rounds: number;
  readonly prefetch: number;
  readonly inFlight: number;
  readonly readAhead?: number;
  readonly consumerEnv: Record<string, string>;
  /** More Node options of both consumers (`BENCH_CONSUMER_NODE_ARGS`). */
  readonly consumerNodeArgs: readonly string[];
}

/** Phases of a module run, in ms from the start of publishing (t0) or as durations. */
export function phasesOf(figures: RunFigures): Record<string, number> | undefined {
  const trace = figures.trace;
  if (!trace) return undefined;
  const since = (at?: number) => (at === undefined ? Number.NaN : Math.round(at - figures.t0));
  const span = (from?: number, to?: number) =>
    from === undefined || to === undefined ? Number.NaN : Math.round(to - from);
  return {
    publishedAt: Math.round(figures.publishSeconds * 1000),
    firstAcceptAt: since(trace.firstAcceptAt),
    storedAt: since(trace.completeAt),
    readPasses: trace.reads,
    verifyMs: span(trace.verifyStartAt, trace.verifyEndAt),
    handlerMs: span(trace.handlerStartAt, trace.handlerEndAt),
    finishMs: span(trace.handlerEndAt, trace.finishEndAt),
    totalMs: Math.round(figures.seconds * 1000),
    acceptCalls: trace.accepts,
    acceptMsAvg: Math.round(trace.acceptMs / Math.max(1, trace.accepts)),
    maxConcurrentAccepts: trace.maxConcurrentAccepts,
  };
}

/** Redis commands per run of the module consumer, as its client counted them. */
export function redisCallsOf(trace?: ModuleTrace): Record<string, number> {
  return Object.fromEntries(
    Object.entries(trace?.redis ?? {}).map(([name, tally]) => [name, tally.calls]),
  );
}

/** Median CPU seconds per process; busy cores of ours, and of the whole machine (shared). */
export function cpuSummary(runs: RunFigures[]) {
  const cpu = medianOf(runs.map((run) => run.cpu));
  const seconds = median(runs.map((run) => run.seconds));
  const total = Object.values(cpu).reduce((sum, value) => sum + value, 0);
  const machine = runs
    .map((run) => run.machineBusyCores)
    .filter((v): v is number => v !== undefined);
  return {
    ...cpu,
    busyCores: round2(total / seconds),
    machineBusyCores: machine.length > 0 ? round2(median(machine)) : undefined,
  };
}

/** The highest of a figure over runs (undefined when no run has it). */
export function maxOver(
  runs: readonly RunFigures[],
  pick: (run: RunFigures) => number | undefined,
): number | undefined {
  const values = runs.map(pick).filter((value): value is number => value !== undefined);
  return values.length > 0 ? Math.max(...values) : undefined;
}

export function caseFigures(
  input: LineSettings & {
    bytes: number;
    fragmentMiB: number;
    raw: RunFigures[];
    module: RunFigures[];
    idleRssMiB: { raw: number; module: number };
    modulePrefetch: number;
    ratioTarget: number;
  },
) {
  const { bytes, raw, module } = input;
  return {
    mb: bytes / MiB,
    fragmentMiB: input.fragmentMiB,
    unsafeSocketTricks: input.unsafeSocketTricks,
    rounds: input.rounds,
    rawMBps: round1(median(raw.map((run) => mbPerSecond(bytes, run.seconds)))),
    moduleMBps: round1(median(module.map((run) => mbPerSecond(bytes, run.seconds)))),
    ratios: raw.map((a, i) => round2(a.seconds / module[i].seconds)),
    ratioTarget: input.ratioTarget,
    // Max over the measured rounds: sampled every BENCH_RSS_SAMPLE_MS, and the kernel's VmHWM.
    rawPeakRssMiB: maxOver(raw, (run) => run.peakRssMiB),
    modulePeakRssMiB: maxOver(module, (run) => run.peakRssMiB),
    rawHwmRssMiB: maxOver(raw, (run) => run.hwmRssMiB),
    moduleHwmRssMiB: maxOver(module, (run) => run.hwmRssMiB),
    rawIdleRssMiB: input.idleRssMiB.raw,
    moduleIdleRssMiB: input.idleRssMiB.module,
    // The round of b with the highest sampled peak: when (ms after publishing began) and of what.
    modulePeakDetail: module.reduce((top, run) => (run.peakRssMiB > top.peakRssMiB ? run : top))
      .peak,
    prefetch: input.prefetch,
    modulePrefetch: input.modulePrefetch,
    inFlight: input.inFlight,
    readAhead: input.readAhead ?? 'default (4)',
    consumerEnv: input.consumerEnv,
    ...(input.consumerNodeArgs.length > 0 && { consumerNodeArgs: input.consumerNodeArgs }),
    modulePhasesMs: medianOf(module.map(phasesOf)),
    cpuSeconds: { raw: cpuSummary(raw), module: cpuSummary(module) },
    moduleRedisCalls: medianOf(module.map((run) => redisCallsOf(run.trace))),
    moduleRedisServerMs: medianOf(module.map((run) => run.redisServerMs)),
  };
}

export function bigCaseFigures(
  input: LineSettings & {
    bytes: number;
    fragmentMiB: number;
    run: RunFigures;
    idleRssMiB: number;
    modulePrefetch: number;
    /** The peak RSS target, when not the store-buffered one. */
    rssTargetMiB?: number;
  },
) {
  const b = input.run;
  const peak = b.hwmRssMiB ?? b.peakRssMiB;
  const rssTargetMiB = input.rssTargetMiB ?? BIG_RSS_TARGET_MIB;
  return {
    mb: input.bytes / MiB,
    fragmentMiB: input.fragmentMiB,
    unsafeSocketTricks: input.unsafeSocketTricks,
    producer: 'streamed (async generator of 1 MiB chunks)',
    moduleMBps: mbPerSecond(input.bytes, b.seconds),
    modulePeakRssMiB: b.peakRssMiB,
    moduleHwmRssMiB: b.hwmRssMiB,
    moduleIdleRssMiB: input.idleRssMiB,
    modulePeakDetail: b.peak,
    rssTargetMiB,
    rssTargetMet: peak <= rssTargetMiB,
    prefetch: input.prefetch,
    modulePrefetch: input.modulePrefetch,
    inFlight: input.inFlight,
    readAhead: input.readAhead ?? 'default (4)',
    consumerEnv: input.consumerEnv,
    ...(input.consumerNodeArgs.length > 0 && { consumerNodeArgs: input.consumerNodeArgs }),
    modulePhasesMs: phasesOf(b),
    cpuSeconds: cpuSummary([b]),
    moduleRedisCalls: redisCallsOf(b.trace),
    moduleRedisServerMs: b.redisServerMs,
  };
}
