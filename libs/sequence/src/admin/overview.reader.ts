import { Inject, Injectable } from '@nestjs/common';
import { errorMessage } from '../core/errors/caught';
import { BOUNDED_SEQUENCE_STORE, SEQUENCE_BUDGETS, type SequenceBudgets } from '../kernel/tokens';
import type { SequenceStore } from '../ports/sequence-store.port';
import { BoxesReader, type BoxTotals } from './boxes.reader';
import { DeadLettersReader, type DeadLetterChannelSummary } from './dead-letters.reader';
import { ResequencerReader, type GapItem } from './resequencer.reader';
import { ADMIN_OPTIONS, type ResolvedAdminOptions } from './admin.options';

export interface Problem {
  readonly severity: 'critical' | 'warning';
  readonly pattern: 'sequence' | 'dead-letters' | 'resequencer' | 'outbox' | 'inbox';
  readonly message: string;
  /** What it concerns (a channel, a key), for a link. */
  readonly target?: string;
}

export interface Overview {
  readonly mutations: boolean;
  readonly problems: readonly Problem[];
  readonly sequences: {
    readonly open: number;
    readonly oldestAgeMs: number;
    readonly storedBytes: number;
    readonly reservedBytes: number;
    readonly limitBytes: number;
  };
  /** `supported: false` when the transport cannot browse its dead letters. */
  readonly deadLetters: {
    readonly total: number;
    readonly channels: number;
    readonly supported: boolean;
  };
  readonly resequencer: { readonly openGaps: number; readonly oldestGapAgeMs: number };
  readonly outbox: BoxTotals;
  readonly inbox: Omit<BoxTotals, 'lagMs'>;
}

/** The buffer fill at which the overview reports a problem. */
const BUFFER_CRITICAL = 0.8;
/** Gaps looked at, at most, for overdue problems; the count itself comes from the stores. */
const GAP_SAMPLE = 1000;

/** Each pattern's state at a glance, and the problems first. */
@Injectable()
export class OverviewReader {
  constructor(
    @Inject(ADMIN_OPTIONS) private readonly options: ResolvedAdminOptions,
    @Inject(BOUNDED_SEQUENCE_STORE) private readonly store: SequenceStore,
    @Inject(SEQUENCE_BUDGETS) private readonly budgets: SequenceBudgets,
    private readonly deadLetters: DeadLettersReader,
    private readonly resequencers: ResequencerReader,
    private readonly boxes: BoxesReader,
  ) {}

  async overview(): Promise<Overview> {
    const now = Date.now();
    const problems: Problem[] = [];
    const stats = await this.store.stats(now);
    const stored = stats.bufferedBytes;
    const reserved = stats.reservedBytes ?? 0;
    const limitBytes = this.budgets.maxBufferedBytes;
    if (limitBytes > 0 && (stored + reserved) / limitBytes >= BUFFER_CRITICAL) {
      problems.push({
        severity: 'critical',
        pattern: 'sequence',
        message:
          `the sequence buffer is ${Math.round(((stored + reserved) / limitBytes) * 100)}% full: ` +
          'new sequences are back-pressured when it fills',
      });
    }
    const deadLetters = await this.deadLetterTotals(problems);
    const gaps = await this.resequencers.gaps(GAP_SAMPLE);
    const gapTotals = await this.resequencers.gapTotals();
    for (const gap of gaps.filter(overdue(now))) {
      problems.push({
        severity: 'warning',
        pattern: 'resequencer',
        message:
          `key ${gap.key} of ${gap.resequencer} has waited ${Math.round(gap.ageMs / 1000)} s ` +
          `for sequence ${gap.expected} (${gap.held} held behind it)`,
        target: `${gap.resequencer}/${gap.key}`,
      });
    }
    const outbox = await this.boxes.totals('outbox', now);
    const inbox = await this.boxes.totals('inbox', now);
    for (const [pattern, totals] of [
      ['outbox', outbox],
      ['inbox', inbox],
    ] as const) {
      if (totals.failed > 0) {
        problems.push({
          severity: 'critical',
          pattern,
          message: `${totals.failed} failed ${pattern} row(s): retry or discard them`,
        });
      }
    }
    return {
      mutations: this.options.mutations,
      problems: [...problems].sort((a, b) => severityRank(a) - severityRank(b)),
      sequences: {
        open: stats.openSequences,
        oldestAgeMs: stats.oldestOpenAt === undefined ? 0 : Math.max(0, now - stats.oldestOpenAt),
        storedBytes: stored,
        reservedBytes: reserved,
        limitBytes,
      },
      deadLetters,
      resequencer: gapTotals,
      outbox,
      inbox: { pending: inbox.pending, failed: inbox.failed },
    };
  }

  private async deadLetterTotals(problems: Problem[]): Promise<Overview['deadLetters']> {
    if (!this.deadLetters.box) return { total: 0, channels: 0, supported: false };
    try {
      const summaries = await this.deadLetters.summary();
      const holding = summaries.filter((summary) => summary.total > 0);
      for (const summary of holding) {
        const reasons = summary.byReason?.map((r) => `${r.reason} ×${r.count}`).join(', ');
        problems.push({
          severity: 'warning',
          pattern: 'dead-letters',
          message: `${summary.total} dead letter(s) ${origin(summary)}${reasons ? `: ${reasons}` : ''}`,
          target: summary.channel,
        });
      }
      return {
        total: holding.reduce((sum, summary) => sum + summary.total, 0),
        channels: holding.length,
        supported: true,
      };
    } catch (error) {
      problems.push({
        severity: 'warning',
        pattern: 'dead-letters',
        message: `could not read the dead letters: ${errorMessage(error)}`,
      });
      return { total: 0, channels: 0, supported: true };
    }
  }
}

function origin(summary: DeadLetterChannelSummary): string {
  return summary.sharedBy
    ? `in ${summary.deadLetterChannel}, shared by ${summary.sharedBy.join(', ')}`
    : `from ${summary.channel}`;
}

function overdue(now: number): (gap: GapItem) => boolean {
  return (gap) => now - gap.since >= gap.timeoutMs;
}

function severityRank(problem: Problem): number {
  return problem.severity === 'critical' ? 0 : 1;
}
