/**
 * A benchmark's results: one JSON line per result on stdout, in one envelope for every benchmark,
 * `{ bench, case, variant, ...figures, ratio, at }`, and the arithmetic the figures share: medians
 * over rounds, and the ratio of the module to the raw baseline measured in the same run (every
 * figure is a ratio against a baseline in the same run; absolute rates are not comparable from
 * one run to the next on a shared machine).
 */
import { MiB } from './measure';

export { MiB };

export const round1 = (value: number) => Math.round(value * 10) / 10;
export const round2 = (value: number) => Math.round(value * 100) / 100;

export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

/** Field-wise median of records of numbers, to two decimals (NaN and missing fields left out). */
export function medianOf(
  records: ReadonlyArray<Readonly<Record<string, number | undefined>> | undefined>,
): Record<string, number> {
  const result: Record<string, number> = {};
  const present = records.filter((record) => record !== undefined);
  for (const key of new Set(present.flatMap((record) => Object.keys(record)))) {
    const values = present
      .map((record) => record[key])
      .filter((value): value is number => value !== undefined && !Number.isNaN(value));
    if (values.length > 0) result[key] = round2(median(values));
  }
  return result;
}

/** MiB per second, to one decimal (the benchmarks' "MB/s"). */
export function mbPerSecond(bytes: number, seconds: number): number {
  return round1(bytes / MiB / seconds);
}

/** The module's rate over the baseline's in each round, and their median: the result's ratio. */
export function ratiosOf(rounds: ReadonlyArray<{ baseline: number; module: number }>): {
  ratio: number | null;
  ratios: number[];
} {
  const ratios = rounds.map(({ baseline, module }) => module / baseline);
  return {
    ratio: ratios.length > 0 ? round2(median(ratios)) : null,
    ratios: ratios.map(round2),
  };
}

/** What every result line starts with. */
export interface ResultEnvelope {
  /** The benchmark (`sequence-rabbitmq`, `claim-check`, ...): the same name as ever. */
  readonly bench: string;
  /** What was measured within it: a fragment size, a payload, a workload. */
  readonly case: string;
  /** How the module was configured: `default`, or `socket-tricks` (`unsafeSocketTricks: true`). */
  readonly variant: string;
  /**
   * The module against the raw baseline of the same run (median of the per-round ratios of
   * their rates); null for a line without a baseline.
   */
  readonly ratio: number | null;
}

/** The variant name of a module path run with `unsafeSocketTricks` as given. */
export function variantOf(unsafeSocketTricks: boolean): string {
  return unsafeSocketTricks ? 'socket-tricks' : 'default';
}

/**
 * Prints one result line: `{ bench, case, variant, ...figures, ratio, at }`, `at` the time of the
 * line (ISO 8601). Figures keep the names they have always had.
 */
export function report(envelope: ResultEnvelope, figures: Record<string, unknown>): void {
  const { bench, variant, ratio } = envelope;
  const line = { bench, case: envelope.case, variant, ...figures, ratio, at: new Date() };
  process.stdout.write(`${JSON.stringify(line)}\n`);
}
