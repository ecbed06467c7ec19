import { Injectable } from '@nestjs/common';
import { ModuleMetrics } from '../kernel/module-metrics';
import { ResequencerCatalog } from './resequencer.catalog';

/**
 * `nest_sequence_resequencer_gap_timeout_seconds{resequencer}`: each resequencer's
 * `gap.timeoutMs`, read from the catalog at every scrape. The shipped open-gap alert compares the
 * oldest gap's age with it, so that one rule serves resequencers of different timeouts.
 */
@Injectable()
export class GapTimeoutMetrics {
  constructor(metrics: ModuleMetrics, catalog: ResequencerCatalog) {
    metrics.gauge(
      'resequencer_gap_timeout_seconds',
      'How long a gap may stay open before its policy acts (gap.timeoutMs), per resequencer',
      ['resequencer'],
      (gauge) => {
        for (const { resequencer } of catalog.all()) {
          gauge.set({ resequencer: resequencer.name }, resequencer.definition.gap.timeoutMs / 1000);
        }
        return Promise.resolve();
      },
    );
  }
}
