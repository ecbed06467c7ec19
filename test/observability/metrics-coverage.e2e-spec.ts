import { Injectable } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import {
  ClaimCheck,
  ClaimCheckService,
  InboxHandler,
  OutboxService,
  ReassembledPayload,
  Resequenced,
  SEQUENCE_TRANSPORT,
  SequencedHandler,
  SequenceModule,
  SplitterService,
  type ClaimedPayload,
  type Transport,
} from 'nest-sequence';
import { buildFragmentHeaders } from 'nest-sequence/wire';
import { Registry } from 'prom-client';
import { crc32 } from '../../libs/sequence/src/core/checksum';
import { GapSweeper } from '../../libs/sequence/src/resequencer/gap.sweeper';
import { ExpirySweeper } from '../../libs/sequence/src/sequence/expiry.sweeper';
import { expandGrafanaVariables, promqlNames } from './promql-names';
import { alertRules, dashboardPanels, dashboardPrefix } from './shipped-files';

const PREFIX = 'nest_sequence_';
/** Series Prometheus makes itself, and the labels it puts on every scraped series. */
const PROMETHEUS_SERIES = new Set(['up']);
const TARGET_LABELS = ['job', 'instance'];
const HISTOGRAM_SUFFIXES = ['_bucket', '_sum', '_count'];

/** One handler per pattern, counting what each received. */
@Injectable()
class EveryPattern {
  readonly handled = { sequence: 0, claim: 0, ordered: 0, inbox: 0 };

  @SequencedHandler({ channel: 'observability.sequence', timeoutMs: 60_000 })
  async sequence(payload: ReassembledPayload): Promise<void> {
    await payload.toBuffer();
    this.handled.sequence++;
  }

  @ClaimCheck({ channel: 'observability.claims' })
  async claim(payload: ClaimedPayload): Promise<void> {
    await payload.toBuffer();
    this.handled.claim++;
  }

  @Resequenced({ channel: 'observability.ordered', gap: { timeoutMs: 1_000, policy: 'alert' } })
  ordered(): void {
    this.handled.ordered++;
  }

  @InboxHandler({ event: 'ObservabilityChecked' })
  inbox(): void {
    this.handled.inbox++;
  }
}

async function eventually(check: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** What the registry holds after the run: each sample name's label names, and whether it has samples. */
interface Inventory {
  readonly labels: Map<string, Set<string>>;
  readonly sampled: Set<string>;
}

/**
 * Runs all four patterns on the embedded defaults (a sequence completed and one expired, a
 * claim-checked payload, resequenced events with a gap left open past its timeout, an outbox
 * event handled by an inbox), then reads the registry as a scrape would.
 */
async function runEveryPattern(): Promise<Inventory> {
  const registry = new Registry();
  const moduleRef = await Test.createTestingModule({
    imports: [
      SequenceModule.forRoot({
        metrics: { registry },
        outbox: {
          outboxEvents: { pollIntervalMs: 50 },
          inboxEvents: { pollIntervalMs: 50 },
        },
        tuning: { sweepers: { expiry: { intervalMs: false }, gaps: { intervalMs: false } } },
      }),
    ],
    providers: [EveryPattern],
  }).compile();
  const app = moduleRef.createNestApplication({ logger: false });
  await app.init();
  try {
    const handlers = app.get(EveryPattern);
    const transport = app.get<Transport>(SEQUENCE_TRANSPORT);

    await app.get(SplitterService).send('observability.sequence', Buffer.alloc(3_000, 7), {
      fragmentBytes: 1_000,
    });
    // Above the inline limit (256 KiB): parked in the payload store, and a ticket sent.
    await app.get(ClaimCheckService).publish('observability.claims', Buffer.alloc(300_000, 9));
    for (const [key, seq] of [
      ['k1', 1],
      ['k1', 2],
      ['k2', 3],
    ] as const) {
      await transport.publish('observability.ordered', Buffer.from(`${key}#${seq}`), {
        'x-resequence-key': key,
        'x-resequence-seq': seq,
      });
    }
    await app.get(OutboxService).transaction(async (tx) =>
      tx.publishEvent({
        type: 'ObservabilityChecked',
        aggregateType: 'Check',
        aggregateId: 'c-1',
        payload: {},
      }),
    );
    // The first of two fragments of a sequence that never completes.
    const body = Buffer.alloc(1_000, 1);
    await transport.publish(
      'observability.sequence',
      body,
      buildFragmentHeaders({
        sequenceId: 'never-complete',
        position: 1,
        size: 2,
        last: false,
        crc32: crc32(body),
      }),
    );

    await eventually(
      () =>
        handlers.handled.sequence === 1 &&
        handlers.handled.claim === 1 &&
        handlers.handled.ordered === 2 &&
        handlers.handled.inbox === 1,
      'every pattern to deliver',
    );
    // Past every timeout: the sequence expires, k2's gap is reported (and stays open: 'alert').
    expect(await app.get(ExpirySweeper).sweep(Date.now() + 120_000)).toBe(1);
    await app.get(GapSweeper).sweep(Date.now() + 5_000);

    const labels = new Map<string, Set<string>>();
    const sampled = new Set<string>();
    for (const metric of await registry.getMetricsAsJSON()) {
      const declared =
        (registry.getSingleMetric(metric.name) as unknown as { labelNames?: string[] })
          .labelNames ?? [];
      const names =
        String(metric.type) === 'histogram'
          ? HISTOGRAM_SUFFIXES.map((suffix) => metric.name + suffix)
          : [metric.name];
      for (const name of names) {
        labels.set(name, new Set([...declared, ...(name.endsWith('_bucket') ? ['le'] : [])]));
      }
      for (const value of metric.values as { metricName?: string; labels: object }[]) {
        const name = value.metricName ?? metric.name;
        sampled.add(name);
        for (const label of Object.keys(value.labels)) labels.get(name)?.add(label);
      }
    }
    return { labels, sampled };
  } finally {
    await app.close();
  }
}

/** What is wrong with one query against the registry, as lines naming metric and label. */
function problemsOf(
  where: string,
  expr: string,
  inventory: Inventory,
  options: { needSamples: boolean; legend?: string },
): string[] {
  const problems: string[] = [];
  const { selectors, grouping } = promqlNames(expr);
  const available = new Set(TARGET_LABELS);
  for (const { metric, labels } of selectors) {
    if (PROMETHEUS_SERIES.has(metric)) continue;
    const known = inventory.labels.get(metric);
    if (!known) {
      problems.push(`${where}: no metric ${metric} in the module's registry`);
      continue;
    }
    if (options.needSamples && !inventory.sampled.has(metric)) {
      problems.push(`${where}: ${metric} has no sample after a run of every pattern`);
    }
    for (const label of known) available.add(label);
    for (const label of labels) {
      if (!known.has(label) && !TARGET_LABELS.includes(label)) {
        problems.push(`${where}: ${metric} has no label ${label}`);
      }
    }
  }
  if (selectors.length === 0) problems.push(`${where}: names no metric`);
  for (const label of grouping) {
    if (!available.has(label)) problems.push(`${where}: no metric of it has the label ${label}`);
  }
  for (const [, label] of (options.legend ?? '').matchAll(/\{\{\s*(\w+)\s*\}\}/g)) {
    if (!grouping.includes(label) && !available.has(label)) {
      problems.push(`${where}: its legend names the label ${label}, which its series lack`);
    }
  }
  return problems;
}

describe('the shipped rules and dashboard name what the module exports', () => {
  let inventory: Inventory;

  beforeAll(async () => {
    inventory = await runEveryPattern();
  });

  it('reads a registry that has the four patterns in it (the check below is not vacuous)', () => {
    for (const name of [
      `${PREFIX}sequences_completed_total`,
      `${PREFIX}claim_check_payloads_checked_out_total`,
      `${PREFIX}resequencer_delivered_total`,
      `${PREFIX}inbox_processed_total`,
      `${PREFIX}dead_letters_total`,
    ]) {
      expect({ name, sampled: inventory.sampled.has(name) }).toEqual({ name, sampled: true });
    }
  });

  it('every metric and label an alert rule names exists, with samples, after a run', () => {
    const rules = alertRules();
    expect(rules.length).toBeGreaterThanOrEqual(8);
    const problems = rules.flatMap((rule) =>
      problemsOf(`alert ${rule.alert}`, rule.expr, inventory, { needSamples: true }),
    );
    expect(problems).toEqual([]);
  });

  it("every metric and label a dashboard panel's query or legend names exists", () => {
    const prefix = dashboardPrefix();
    expect(prefix).toBe(PREFIX);
    const queries = dashboardPanels().flatMap((panel) =>
      (panel.targets ?? []).map((target) => ({ panel, target })),
    );
    expect(queries.length).toBeGreaterThan(30);
    const problems = queries.flatMap(({ panel, target }) =>
      problemsOf(
        `panel "${panel.title}" ${target.refId}`,
        expandGrafanaVariables(target.expr, prefix),
        inventory,
        { needSamples: false, legend: target.legendFormat },
      ),
    );
    expect(problems).toEqual([]);
  });
});
