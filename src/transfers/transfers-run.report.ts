import type { ResequencerKeyState } from 'nest-sequence/ports';
import { statusOf } from './transfer-status.channels';
import type { TransferView, TransfersSummary } from './transfer-status.projection';
import type { SimulationReport } from './upstream.simulator';

/** An HTTP answer as the demo prints and checks it. */
export interface HttpAnswer {
  readonly path: string;
  readonly status: number;
  readonly body: unknown;
}

/** Everything one run of `npm run demo:transfers` observed, for the summary and the checks. */
export interface TransfersRun {
  readonly adapters: { readonly transport: string; readonly store: string };
  readonly channels: { readonly shuffled: string; readonly ordered: string };
  readonly gapTimeoutMs: number;
  readonly simulation: SimulationReport;
  readonly summary: TransfersSummary;
  /** Statuses that arrived ahead of their turn and waited in the resequencer store. */
  readonly heldBack: number;
  /** What the resequencer store holds for the broken transfer. */
  readonly brokenInStore: ResequencerKeyState;
  readonly elapsedMs: number;
  readonly broken: HttpAnswer;
  readonly good: HttpAnswer;
}

/** The summary lines the demo prints. */
export function describeRun(run: TransfersRun): string[] {
  const { simulation, summary, channels, brokenInStore } = run;
  const total = Object.values(simulation.published).reduce((sum, count) => sum + count, 0);
  const services = Object.entries(simulation.published)
    .map(([service, count]) => `${service} ${count}`)
    .join(', ');
  const lines = [
    `transfers demo on the ${run.adapters.transport} transport and the ${run.adapters.store} resequencer store`,
    `  ${simulation.transferIds.length} transfers: ${total} statuses published shuffled to ${channels.shuffled} (${services})`,
    `  ${run.heldBack} statuses arrived ahead of their turn and waited in the resequencer store`,
    `  ${summary.byStatus.settled} transfers settled; ${summary.applied} statuses applied in order from ${channels.ordered}`,
    `  statuses refused as regressions: ${summary.regressionsRefused} (duplicates ignored: ${summary.duplicatesIgnored})`,
  ];
  for (const gap of summary.gaps) {
    const held = brokenInStore.buffered.map((seq) => `${seq} (${statusOf(seq) ?? '?'})`);
    lines.push(
      `  gap alert: transfer ${gap.id} waits for seq ${gap.expected} (${statusOf(gap.expected) ?? '?'}) ` +
        `since ${gap.since}, past the ${run.gapTimeoutMs} ms gap timeout` +
        (gap.id === simulation.brokenTransferId && held.length > 0
          ? `; the resequencer holds seq ${held.join(', ')} behind it`
          : ''),
    );
  }
  lines.push(`  done in ${run.elapsedMs} ms`);
  for (const answer of [run.broken, run.good]) {
    lines.push(`GET ${answer.path} -> ${answer.status} ${JSON.stringify(answer.body)}`);
  }
  return lines;
}

/** What is wrong with the run: empty when every transfer ended as the simulation implies. */
export function failedChecks(run: TransfersRun): string[] {
  const { simulation, summary } = run;
  const transfers = simulation.transferIds.length;
  const problems: string[] = [];
  const check = (ok: boolean, problem: string) => ok || problems.push(problem);

  check(
    summary.transfers === transfers,
    `the projection knows ${summary.transfers} transfers, ${transfers} were sent`,
  );
  check(
    summary.byStatus.settled === transfers - 1,
    `${summary.byStatus.settled} transfers settled, expected ${transfers - 1} (all but the broken one)`,
  );
  check(
    summary.regressionsRefused === 0,
    `${summary.regressionsRefused} statuses arrived after a later one of their transfer`,
  );
  check(
    summary.gaps.length === 1 && summary.gaps[0].id === simulation.brokenTransferId,
    `expected one open gap, on ${simulation.brokenTransferId}; got ${JSON.stringify(summary.gaps)}`,
  );
  const broken = run.broken.body as Partial<TransferView>;
  check(
    run.broken.status === 200 &&
      broken.status === 'initiated' &&
      broken.seq === 1 &&
      broken.gap?.expected === 2,
    `GET ${run.broken.path} should show initiated (seq 1) with a gap expecting 2`,
  );
  const good = run.good.body as Partial<TransferView>;
  check(
    run.good.status === 200 && good.status === 'settled' && good.seq === 3 && !good.gap,
    `GET ${run.good.path} should show settled (seq 3) without a gap`,
  );
  return problems;
}
