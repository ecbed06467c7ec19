/**
 * The Outbox benchmark's throughput summary: medians over rounds of each path's messages/s, and
 * medians of per-round ratios (both paths measured in the same round).
 */
import { median, round2 } from './harness/report';
import type { CpuPerThousand } from './outbox.cpu';
import type { ModuleTimed } from './outbox.module';
import type { Timed } from './outbox.raw';
import type { PathName } from './outbox.settings';

export type ThroughputPath = Exclude<PathName, 'latency'>;

/** The order of the paths in odd rounds (reversed in even ones). */
export const ORDER: ThroughputPath[] = ['raw', 'pg', 'module', 'relay', 'pto', 'pto-relay'];

export type Round = Partial<Record<ThroughputPath, Timed | ModuleTimed>>;

export const rateOf = (result: Timed) => result.messages / result.seconds;

export function summarize(rounds: Round[]) {
  const rates = (path: ThroughputPath) => {
    const values = rounds.flatMap((round) => (round[path] ? [rateOf(round[path])] : []));
    return values.length > 0 ? Math.round(median(values)) : undefined;
  };
  /** Per round: messages/s of `path` / messages/s of `to`. */
  const ratios = (path: ThroughputPath, to: ThroughputPath) =>
    rounds.flatMap((round) => {
      const a = round[to];
      const b = round[path];
      return a && b ? [round2(rateOf(b) / rateOf(a))] : [];
    });
  const medianOf = (values: number[]) => (values.length > 0 ? round2(median(values)) : undefined);
  const commitRates = (path: ThroughputPath) => {
    const values = rounds.flatMap((round) => {
      const result = round[path];
      return result && 'commitSeconds' in result && result.commitSeconds
        ? [result.messages / result.commitSeconds]
        : [];
    });
    return values.length > 0 ? Math.round(median(values)) : undefined;
  };
  const cpu = (path: ThroughputPath) => {
    const readings = rounds.flatMap((round) => (round[path] ? [round[path].cpu] : []));
    if (readings.length === 0) return undefined;
    const of = (name: keyof CpuPerThousand) => {
      const values = readings.flatMap((reading) =>
        reading[name] === undefined ? [] : [reading[name]],
      );
      return values.length > 0 ? Math.round(median(values)) : undefined;
    };
    return {
      node: of('node'),
      rabbitmq: of('rabbitmq'),
      postgres: of('postgres'),
      machine: of('machine'),
    };
  };
  const relayPhases = (path: ThroughputPath) =>
    rounds.flatMap((round) => {
      const result = round[path];
      return result && 'relay' in result && result.relay ? [result.relay] : [];
    });
  const toRaw = {
    module: ratios('module', 'raw'),
    relay: ratios('relay', 'raw'),
    pto: ratios('pto', 'raw'),
    ptoRelay: ratios('pto-relay', 'raw'),
  };
  return {
    messagesPerSecond: {
      raw: rates('raw'),
      pgCommitsOnly: rates('pg'),
      module: rates('module'),
      moduleRelayOnly: rates('relay'),
      pto: rates('pto'),
      ptoRelayOnly: rates('pto-relay'),
    },
    ratioToRaw: {
      module: medianOf(toRaw.module),
      moduleRelayOnly: medianOf(toRaw.relay),
      pto: medianOf(toRaw.pto),
      ptoRelayOnly: medianOf(toRaw.ptoRelay),
    },
    ratiosToRawPerRound: toRaw,
    moduleToPto: {
      live: medianOf(ratios('module', 'pto')),
      relayOnly: medianOf(ratios('relay', 'pto-relay')),
    },
    moduleToPgCommitsOnly: medianOf(ratios('module', 'pg')),
    writersCommitsPerSecond: { module: commitRates('module'), pto: commitRates('pto') },
    cpuMsPerThousandMessages: Object.fromEntries(ORDER.map((path) => [path, cpu(path)])),
    relayPhases: { module: relayPhases('module'), relayOnly: relayPhases('relay') },
    pgStatsPerThousandMessages: {
      pg: rounds.flatMap((round) => (round.pg?.pgStats ? [round.pg.pgStats] : [])),
      module: rounds.flatMap((round) => (round.module?.pgStats ? [round.module.pgStats] : [])),
    },
  };
}
