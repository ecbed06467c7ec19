import { Injectable } from '@nestjs/common';
import { OutboxRuntime } from '../outbox/outbox.runtime';
import type { BoxName, BoxStats, OutboxStore, StoredRecord } from '../ports/outbox-store.port';
import type { MutationAnswer } from './admin-actions';
import { unsupported } from './admin.errors';

/** The outbox (what this service sends) or the inbox (what it received). */
export type BoxSide = 'outbox' | 'inbox';

export const BOXES: Readonly<Record<BoxSide, readonly BoxName[]>> = {
  outbox: ['outbox_events', 'outbox_commands'],
  inbox: ['inbox_events', 'inbox_commands'],
};

/** A failed outbox or inbox row. */
export interface FailedRowItem {
  readonly id: string;
  /** The box (table) holding it: `outbox_events`, `inbox_commands`, … */
  readonly channel: BoxName;
  readonly kind: string;
  readonly type: string;
  readonly attempts: number;
  readonly lastError: string | null;
  readonly createdAt: number;
  /** When its last attempt was due; stores do not record the failure's own time. */
  readonly failedAt: number;
}

export interface BoxTotals {
  readonly pending: number;
  readonly failed: number;
  readonly lagMs: number;
}

function failedRow(box: BoxName, record: StoredRecord): FailedRowItem {
  return {
    id: record.id,
    channel: box,
    kind: record.kind,
    type: record.type,
    attempts: record.attempts,
    lastError: record.lastError,
    createdAt: record.createdAt,
    // A row's first attempt is due when it is created (stores write the epoch there, so that
    // every clock finds it due): one that failed at once was due at its creation.
    failedAt: Math.max(record.nextAttemptAt, record.createdAt),
  };
}

/** Outbox and inbox rows, through the outbox runtime's store. */
@Injectable()
export class BoxesReader {
  constructor(private readonly runtime: OutboxRuntime) {}

  get inUse(): boolean {
    return this.runtime.inUse;
  }

  async failed(side: BoxSide, limit: number): Promise<FailedRowItem[]> {
    if (!this.runtime.inUse) return [];
    const store = await this.runtime.ready();
    const items: FailedRowItem[] = [];
    for (const box of BOXES[side]) {
      for (const record of await store.listFailed(box, limit)) items.push(failedRow(box, record));
    }
    return items.sort((a, b) => a.createdAt - b.createdAt).slice(0, limit);
  }

  async totals(side: BoxSide, now: number): Promise<BoxTotals> {
    if (!this.runtime.inUse) return { pending: 0, failed: 0, lagMs: 0 };
    const store = await this.runtime.ready();
    const stats: BoxStats[] = [];
    for (const box of BOXES[side]) stats.push(await store.stats(box));
    const oldest = Math.min(...stats.map((s) => s.oldestPendingAt ?? Infinity));
    return {
      pending: stats.reduce((sum, s) => sum + s.pending, 0),
      failed: stats.reduce((sum, s) => sum + s.failed, 0),
      lagMs: Number.isFinite(oldest) ? Math.max(0, now - oldest) : 0,
    };
  }

  /** The rows with this id, in whichever box of the side. */
  async find(side: BoxSide, id: string): Promise<Array<{ box: BoxName; record: StoredRecord }>> {
    if (!this.runtime.inUse) return [];
    const store = await this.runtime.ready();
    const found: Array<{ box: BoxName; record: StoredRecord }> = [];
    for (const box of BOXES[side]) {
      const record = await store.get(box, id);
      if (record) found.push({ box, record });
    }
    return found;
  }

  /** Retries the failed rows with these ids, in `only` or in every box of the side. */
  async retry(side: BoxSide, ids: readonly string[], only?: BoxName): Promise<MutationAnswer> {
    const store = await this.store(side);
    let changed = 0;
    for (const box of only ? [only] : BOXES[side]) {
      const retried = await store.retry(box, ids, Date.now());
      if (retried > 0) this.runtime.wake(box);
      changed += retried;
    }
    return this.answer(side, 'retried', ids, changed);
  }

  /** Deletes the failed rows with these ids, in `only` or in every box of the side. */
  async discard(side: BoxSide, ids: readonly string[], only?: BoxName): Promise<MutationAnswer> {
    const store = await this.store(side);
    const discard = store.discard?.bind(store);
    if (!discard) throw unsupported(`the ${store.name} outbox store cannot discard rows`);
    let changed = 0;
    for (const box of only ? [only] : BOXES[side]) {
      const discarded = await discard(box, ids);
      // In an ordered box, what was held back behind a discarded row is due now.
      if (discarded > 0) this.runtime.wake(box);
      changed += discarded;
    }
    return this.answer(side, 'discarded', ids, changed);
  }

  private async store(side: BoxSide): Promise<OutboxStore> {
    if (!this.runtime.inUse) {
      throw unsupported(`this application uses no ${side} (no outbox store, no inbox handlers)`);
    }
    return this.runtime.ready();
  }

  private answer(
    side: BoxSide,
    verb: string,
    ids: readonly string[],
    changed: number,
  ): MutationAnswer {
    const untouched = ids.length - changed;
    const message =
      changed === 0
        ? `nothing changed: none of the ${ids.length} id(s) is a failed ${side} row ` +
          '(already retried, discarded, published, or never there)'
        : `${changed} ${side} row(s) ${verb}` +
          (untouched > 0 ? `; ${untouched} id(s) were not failed rows and were left alone` : '');
    return { changed, message };
  }
}
