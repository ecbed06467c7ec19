/**
 * The rounds of a benchmark: an optional warm-up round, whose figures are discarded, then the
 * measured rounds; in each, the baseline and the module run one after the other, either always
 * baseline first or alternating (a b, b a, a b, ...) so that a load that rises or falls across a
 * round does not always favour the same path.
 */
export interface Round {
  /** 0 for the warm-up, then 1, 2, ... */
  readonly number: number;
  /** `warm-up` or `round <n>`, for progress lines and run names. */
  readonly label: string;
  readonly warmUp: boolean;
  /** Whether the baseline runs before the module in this round. */
  readonly baselineFirst: boolean;
}

export interface RoundPlan {
  /** Measured rounds. */
  readonly rounds: number;
  /** One warm-up round before them. */
  readonly warmUp: boolean;
  /** Alternate the order: odd rounds baseline first, even ones (and the warm-up) module first. */
  readonly alternate: boolean;
}

export function roundsOf(plan: RoundPlan): Round[] {
  const rounds: Round[] = [];
  for (let number = plan.warmUp ? 0 : 1; number <= plan.rounds; number++) {
    rounds.push({
      number,
      label: number === 0 ? 'warm-up' : `round ${number}`,
      warmUp: number === 0,
      baselineFirst: !plan.alternate || number % 2 === 1,
    });
  }
  return rounds;
}
