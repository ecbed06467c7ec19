/**
 * A threshold an indicator checked and what it measured: why the indicator is down (`tripped`),
 * or what comes close to its limit (`warnings`).
 */
// A type alias, not an interface: terminus takes the details as a `Record<string, unknown>`.
export type HealthFinding = {
  /** The option that sets the limit (`sequence.bufferPercent`, `outbox.lagMs`, …). */
  readonly threshold: string;
  /** What was measured, when an indicator checks several things (a resequencer's name). */
  readonly subject?: string;
  /** The value measured, in the limit's unit (percent, ms, a count). */
  readonly value: number;
  readonly limit: number;
  /** The finding in words, with the value and the limit. */
  readonly message: string;
  /** Where the runbook says what to do: a section of docs/operations.md. */
  readonly runbook: string;
};

/** What the indicators add to their details once they judged thresholds. */
export type HealthFindings = {
  /** Thresholds passed: why the indicator is down. Absent when none. */
  readonly tripped?: readonly HealthFinding[];
  /** Values at or above `warnRatio` of their limit, not past it. Absent when none. */
  readonly warnings?: readonly HealthFinding[];
};

/** One measure to judge against a threshold. */
export interface HealthMeasure {
  readonly threshold: string;
  readonly subject?: string;
  readonly value: number;
  /** `undefined`: the threshold is off (nothing judged). */
  readonly limit: number | undefined;
  /** Down when the value reaches the limit (a percent full), rather than passes it (an age). */
  readonly downAtLimit?: boolean;
  /** The section of docs/operations.md. */
  readonly runbook: string;
  /** The finding in words, e.g. `buffer 85% full, limit 80%`. */
  describe(value: number, limit: number): string;
}

/** Judges measures against their thresholds: down when any is past its limit. */
export class HealthVerdict {
  private readonly trippedFindings: HealthFinding[] = [];
  private readonly warningFindings: HealthFinding[] = [];

  /** @param warnRatio a fraction of each limit from which a value warns; `undefined`: never. */
  constructor(private readonly warnRatio: number | undefined) {}

  judge(measure: HealthMeasure): void {
    const { value, limit } = measure;
    if (limit === undefined || !Number.isFinite(value)) return;
    const finding: HealthFinding = {
      threshold: measure.threshold,
      ...(measure.subject === undefined ? {} : { subject: measure.subject }),
      value,
      limit,
      message: measure.describe(value, limit),
      runbook: measure.runbook,
    };
    const down = measure.downAtLimit ? value >= limit : value > limit;
    if (down) {
      this.trippedFindings.push(finding);
    } else if (this.warnRatio !== undefined && value > 0 && value >= this.warnRatio * limit) {
      this.warningFindings.push(finding);
    }
  }

  get down(): boolean {
    return this.trippedFindings.length > 0;
  }

  findings(): HealthFindings {
    return {
      ...(this.trippedFindings.length > 0 && { tripped: this.trippedFindings }),
      ...(this.warningFindings.length > 0 && { warnings: this.warningFindings }),
    };
  }
}

/** A duration in ms for a message: `950 ms`, `42.5 s`, `12.3 min`, `5.2 h`. */
export function formatMs(ms: number): string {
  if (ms < 1_000) return `${Math.round(ms)} ms`;
  if (ms < 120_000) return `${round1(ms / 1_000)} s`;
  if (ms < 7_200_000) return `${round1(ms / 60_000)} min`;
  return `${round1(ms / 3_600_000)} h`;
}

function round1(value: number): number {
  return Math.round(value * 10) / 10;
}

/** Runbook sections of docs/operations.md that findings point to. */
export const RUNBOOKS = {
  bufferFull: 'docs/operations.md#buffer-full',
  sequenceTooOld: 'docs/operations.md#sequence-too-old',
  openGap: 'docs/operations.md#open-gap',
  outboxLag: 'docs/operations.md#outbox-lag',
  failedOutboxRows: 'docs/operations.md#failed-outbox-rows',
} as const;
