import { Injectable } from '@nestjs/common';
import type { Counter, Gauge } from 'prom-client';
import type { AcceptOutcome } from '../ports/resequencer-store.port';
import { DeadLetterMetrics } from '../kernel/dead-letter.metrics';
import { ModuleMetrics } from '../kernel/module-metrics';

/** What became of an input event: the store's answer, or a refusal before it. */
export type ResequencerIntake = AcceptOutcome['kind'] | 'invalid';

/** prom-client metrics of the Resequencer, in the same registry and with the same prefix as the rest. */
@Injectable()
export class ResequencerMetrics {
  private readonly events: Counter<'resequencer' | 'outcome'>;
  private readonly deliveries: Counter<'resequencer'>;
  private readonly deadLetters: Counter<'resequencer' | 'reason'>;
  private readonly gaps: Counter<'resequencer' | 'type'>;
  private readonly handlerFailures: Counter<'resequencer'>;
  private readonly orderAtRisk: Counter<'resequencer'>;
  private readonly buffered: Gauge<'resequencer'>;
  private readonly bufferedBytes: Gauge<'resequencer'>;

  constructor(
    metrics: ModuleMetrics,
    private readonly sentDeadLetters: DeadLetterMetrics,
  ) {
    const counter = metrics.counter.bind(metrics);
    const gauge = metrics.gauge.bind(metrics);

    this.events = counter(
      'resequencer_events_total',
      'Input events by outcome: released, buffered, duplicate, late, full, invalid',
      ['resequencer', 'outcome'],
    );
    this.deliveries = counter(
      'resequencer_delivered_total',
      'Events delivered in order (handler returned, or output publish confirmed)',
      ['resequencer'],
    );
    this.deadLetters = counter(
      'resequencer_dead_lettered_total',
      'Events and records put on the dead-letter channel, by reason',
      ['resequencer', 'reason'],
    );
    this.gaps = counter('resequencer_gaps_total', 'Gap outcomes: alert, skipped, dead-lettered', [
      'resequencer',
      'type',
    ]);
    this.handlerFailures = counter(
      'resequencer_handler_failures_total',
      'Handler calls that threw',
      ['resequencer'],
    );
    this.orderAtRisk = counter(
      'resequencer_output_order_at_risk_total',
      'Output publishes that failed while later ones of their key were confirmed ' +
        '(outputInFlight above 1): the output may hold those later ones first',
      ['resequencer'],
    );
    this.buffered = gauge(
      'resequencer_buffered',
      'Events buffered behind gaps, as last seen by this instance',
      ['resequencer'],
    );
    this.bufferedBytes = gauge(
      'resequencer_buffered_bytes',
      'Bytes of the events buffered behind gaps (body, headers and 64 bytes each), as last seen ' +
        'by this instance',
      ['resequencer'],
    );
  }

  received(resequencer: string, outcome: ResequencerIntake): void {
    this.events.inc({ resequencer, outcome });
  }

  delivered(resequencer: string, count = 1): void {
    this.deliveries.inc({ resequencer }, count);
  }

  deadLettered(resequencer: string, reason: string): void {
    this.deadLetters.inc({ resequencer, reason });
  }

  /**
   * A dead letter or gap record the resequencer published itself, to the dead-letter channel of
   * `channel` (its input), confirmed: for the module-wide `dead_letters_total`.
   */
  deadLetterSent(channel: string, reason: string): void {
    this.sentDeadLetters.deadLettered(channel, reason);
  }

  gap(resequencer: string, type: 'alert' | 'skipped' | 'dead-lettered'): void {
    this.gaps.inc({ resequencer, type });
  }

  handlerFailed(resequencer: string): void {
    this.handlerFailures.inc({ resequencer });
  }

  outputOrderAtRisk(resequencer: string, count = 1): void {
    this.orderAtRisk.inc({ resequencer }, count);
  }

  bufferedNow(resequencer: string, count: number, bytes: number): void {
    this.buffered.set({ resequencer }, count);
    this.bufferedBytes.set({ resequencer }, bytes);
  }
}
