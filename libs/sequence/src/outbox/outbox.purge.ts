import { Logger } from '@nestjs/common';
import type { SchedulerRegistry } from '@nestjs/schedule';
import { clockFrom } from '../core/async';
import { asError } from '../core/errors/caught';
import { Sweeper } from '../kernel/sweeper';
import type { ResolvedOptions } from '../options/resolved-options';
import { BOX_NAMES, type OutboxStore } from '../ports/outbox-store.port';

export const OUTBOX_PURGE_INTERVAL = 'nest-sequence:outbox-purge';

/**
 * Deletes completed records past each box's retention, in small batches: one statement at a
 * time, so that a large backlog (retention just switched on) does not hold the shutdown: it stops
 * between statements and goes on at the next interval. The outbox runtime starts it once the
 * store is open.
 */
export class OutboxPurge extends Sweeper<number> {
  protected readonly what = 'outbox purge';

  constructor(
    private readonly store: OutboxStore,
    private readonly options: Pick<ResolvedOptions, 'outbox' | 'tuning'>,
    schedulerRegistry: SchedulerRegistry | undefined,
  ) {
    super(
      OUTBOX_PURGE_INTERVAL,
      options.tuning.sweepers.purge,
      new Logger('Outbox'),
      schedulerRegistry,
    );
  }

  protected async sweepOnce(now: number): Promise<number> {
    const clock = clockFrom(now);
    let deleted = 0;
    let failure: Error | undefined;
    const { batchSize } = this.settings;
    for (const box of BOX_NAMES) {
      const { retentionMs } = this.options.outbox.boxes[box];
      if (retentionMs === false || this.stopping) continue;
      try {
        // A retention longer than the epoch is old reaches before it: nothing is that old.
        const completedBefore = Math.max(0, clock() - retentionMs);
        while (!this.stopping) {
          const purged = await this.store.purge(box, { completedBefore, batchSize, maxBatches: 1 });
          deleted += purged;
          if (purged < batchSize) break;
        }
      } catch (error) {
        // One box failing must not leave the boxes after it unpurged.
        failure ??= asError(error);
      }
    }
    if (failure !== undefined) throw failure;
    return deleted;
  }
}
